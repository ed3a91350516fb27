"""The worker's per-call time limit on PostgreSQL (``engine.db_thread``) against a real
server: a call whose answer has come but whose thread is late to read it (a process
starved of CPU, as 32 daemons starting on 2 cores are) is left to finish; a call whose
answer never comes is broken off."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg import pq
from sqlalchemy.exc import DBAPIError

from runner.engine.db_thread import DatabaseThread
from runner.store.checked_out import server_wait
from runner.store.db import make_engine

pytestmark = pytest.mark.postgres


def _late_reader(engine, sql: bytes, late: float) -> object:
    """Send ``sql`` on a checked-out connection, sleep ``late`` seconds without reading
    the answer (the starved thread), then read it."""
    with engine.connect() as conn:
        pgconn = conn.connection.dbapi_connection.pgconn
        try:
            pgconn.send_query(sql)
            time.sleep(late)
            while pgconn.is_busy():
                pgconn.consume_input()
                time.sleep(0.01)
            result = pgconn.get_result()
            while pgconn.get_result() is not None:
                pass
        except psycopg.OperationalError as exc:  # what SQLAlchemy would wrap
            conn.invalidate()
            raise DBAPIError(None, None, exc) from exc
        assert result is not None and result.status == pq.ExecStatus.TUPLES_OK
        return result.get_value(0, 0)


def test_server_wait_counts_from_the_last_send_the_server_has_not_answered(pg_url: str) -> None:
    engine = make_engine(pg_url)
    me = threading.get_ident()
    with engine.connect() as conn:
        pgconn = conn.connection.dbapi_connection.pgconn
        time.sleep(0.3)
        assert server_wait(me) == 0.0  # the server answered the last thing sent
        pgconn.send_query(b"SELECT 1 FROM pg_sleep(1)")
        time.sleep(0.6)
        waited = server_wait(me)
        assert waited is not None and 0.5 <= waited < 1.0  # asked 0.6 s ago, no answer
        time.sleep(0.8)  # the answer has come, unread
        assert server_wait(me) == 0.0
        assert server_wait(me + 1) is None  # another thread holds no connection
        assert server_wait(None) is None
        while pgconn.get_result() is not None:
            pass
    assert server_wait(me) is None  # given back
    engine.dispose()


def _select_one(engine) -> object:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT 1").scalar()


def test_a_late_reader_is_left_to_finish_a_silent_server_is_not(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(pg_url, pool=1)
    broken: list[str] = []

    async def main() -> tuple[object, object, BaseException | None]:
        db = DatabaseThread("test-db", timeout=0.5)
        try:
            value = await db.call(_late_reader, engine, b"SELECT 42", 1.2)  # < STARVED * 0.5 s
            broken.extend(r.getMessage() for r in caplog.records if "broken off" in r.getMessage())
            again = await db.call(_select_one, engine)  # the same connection, still whole
            try:  # the answer takes 3 s to come: the call is broken off at 0.5 s
                await db.call(_late_reader, engine, b"SELECT 7 FROM pg_sleep(3)", 0.0)
                silent = None
            except DBAPIError as exc:
                silent = exc
            return value, again, silent
        finally:
            db.shutdown()

    started = time.monotonic()
    with caplog.at_level("WARNING", logger="flowrun.worker"):
        value, again, silent = asyncio.run(main())
    assert value == b"42" and again == 1
    assert broken == []  # the late reader's connection was not broken off
    assert silent is not None
    assert any("broken off" in r.getMessage() for r in caplog.records)
    assert time.monotonic() - started < 4.5  # the silent call did not wait its 3 s out
    engine.dispose()
