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
