"""The PostgreSQL side of ``runner.store.dialect`` and ``make_engine(readonly=True)`` on
the real server."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from runner.store.db import make_engine, read_engine
from runner.store.dialect import POSTGRESQL, dialect_of


def test_postgres_dialect_and_readonly_engine(pg_url: str) -> None:
    engine = make_engine(pg_url)
    reader = make_engine(pg_url, readonly=True)
    try:
        d = dialect_of(engine)
        assert d is POSTGRESQL and d.skip_locked and not d.serial_writes
        assert read_engine(engine) is engine, "PostgreSQL reads never take a write lock"
        with reader.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM instances")).scalar() == 0
        with pytest.raises(DBAPIError, match="read-only"), reader.begin() as conn:
            conn.execute(text("DELETE FROM instances"))
        ids = d.ids_value([3, 1])
        with engine.connect() as conn:
            got = conn.execute(
                text("SELECT x FROM unnest(CAST(:ids AS int[])) AS x ORDER BY x"), {"ids": ids}
            )
            assert [r[0] for r in got] == [1, 3]
    finally:
        reader.dispose()
        engine.dispose()


def test_only_a_trusting_thread_skips_the_ping_of_a_fresh_connection(pg_url: str) -> None:
    """Every checkout pings the pooled connection first (a dead one is replaced), except
    on a thread that called ``trust_fresh_connections`` (the worker's database thread)
    when the connection was used less than ``PING_AFTER`` s ago: there the statement
    meets the dead connection (and the worker retries its cycle)."""
    import threading

    from sqlalchemy.exc import OperationalError

    from runner.store.db import trust_fresh_connections

    engine = make_engine(pg_url)
    admin = make_engine(pg_url)

    def kill_pooled() -> None:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with admin.connect() as conn:
            # waits (up to 30 s) until the backend is gone
            conn.execute(text("SELECT pg_terminate_backend(:p, 30000)"), {"p": pid})

    def select_one() -> int:
        with engine.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar()

    got: list = []

    def trusting() -> None:
        trust_fresh_connections()
        kill_pooled()
        try:
            got.append(select_one())
        except OperationalError as exc:
            got.append(exc)
        got.append(select_one())  # the pool dropped the dead connection

    try:
        kill_pooled()
        assert select_one() == 1, "pinged first: the dead connection was replaced"
        t = threading.Thread(target=trusting)
        t.start()
        t.join(60)
        assert isinstance(got[0], OperationalError), got
        assert got[1] == 1
    finally:
        admin.dispose()
        engine.dispose()
