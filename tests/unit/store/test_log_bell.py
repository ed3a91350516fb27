"""``logs -f`` is woken by the log writer's commits (``runner.store.log_bell``): the
inotify bell on a real SQLite file, ``NOTIFY flowrun_logs`` on the real PostgreSQL
server, where a bell that has heard nothing times out."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from runner.store.db import make_engine
from runner.store.log_bell import LogBell, notify_logs
from tests.support.fault import engine_at


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        engine = engine_at(tmp_path)
    else:
        engine = make_engine(request.getfixturevalue("pg_url"))
    with engine.begin() as conn:  # the SQLite file in WAL mode, its -wal there
        conn.execute(text("CREATE TABLE IF NOT EXISTS bell_probe (x integer)"))
    yield engine
    engine.dispose()


def test_a_commit_of_log_rows_wakes_the_follower(engine) -> None:
    bell = LogBell(engine)
    try:
        if engine.dialect.name == "postgresql":  # (SQLite's -wal may be touched by others)
            assert bell.wait(0.05) is False  # nothing notified since it was opened
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO bell_probe VALUES (1)"))
            notify_logs(conn)
        assert bell.wait(60) is True
    finally:
        bell.close()
