"""An idle ``flowrun --daemon`` on PostgreSQL costs the database almost nothing: counted as
committed transactions of its own fresh database (``pg_stat_database.xact_commit``) over a
window, read from another database so the counting itself is not counted.

With a 30 s lease the daemon beats every 10 s, looks for due work and lost attempts every
15 s and asks for unhandled events every 15 s: at most about 4 commits in an 8 s window.
Before (heartbeat every 2 s, each checkout of a pooled connection pinged in a transaction of
its own) it committed at least 8 there.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from runner.store.db import make_engine
from tests.conftest import ADMIN_URL
from tests.support.fault import Flowrun, poll, sql, write_flow

pytestmark = pytest.mark.postgres

FLOW = """\
initial: s1
states:
  s1: {call: "idle_tasks:run", next: done}
  done: {terminal: true}
"""

WINDOW = 8.0  # seconds counted
# seconds after the listener connected: start-up is not idle time, and a backend that
# commits twice within 1 s reports the second commit to pg_stat_database up to 10 s later
# (PostgreSQL's PGSTAT_MIN_INTERVAL and PGSTAT_IDLE_INTERVAL)
SETTLE = 12.0
BOUND = 5  # commits allowed in the window (the old code: >= 8)


def _admin():
    return psycopg.connect(ADMIN_URL.replace("postgresql+psycopg://", "postgresql://", 1),
                           autocommit=True)  # fmt: skip


def _commits(db: str) -> int:
    with _admin() as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (db,))
        return int(row.fetchone()[0])


def _listening(db: str) -> bool:
    with _admin() as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN %%'",
            (db,),
        ).fetchone()
        return int(row[0]) >= 1


def test_an_idle_daemon_commits_less_than_one_transaction_a_second(tmp_path: Path, pg_url):
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "idle", FLOW, {"idle_tasks": "def run(ctx):\n    return True\n"})
    fr.db = pg_url
    db = pg_url.rpartition("/")[2]
    engine = make_engine(pg_url)
    daemon = fr.daemon(worker_id="idler", lease=30)
    try:
        poll(
            lambda: sql(engine, "SELECT count(*) FROM workers WHERE id = 'idler'")[0][0],
            timeout=120,
            what="daemon registered",
        )
        assert sql(engine, "SELECT heartbeat_every FROM workers")[0][0] == 10.0
        engine.dispose()  # its connections commit nothing more
        poll(lambda: _listening(db), timeout=60, what="listening")
        time.sleep(SETTLE)
        before = _commits(db)
        time.sleep(WINDOW)
        after = _commits(db)
        assert daemon.proc.poll() is None, daemon.log()
        assert after - before <= BOUND, f"{after - before} commits in {WINDOW:g} s"
    finally:
        daemon.stop()
        engine.dispose()


def test_exit_when_idle_exits_at_its_own_look_not_at_the_next_heartbeat(
    tmp_path: Path, pg_url
) -> None:
    """A worker woken by notifications sleeps until its next timer: its look for
    anything left (every 0.2 s) must be one of them, or ``--exit-when-idle`` waits for
    the heartbeat (a third of the lease: 40 s here)."""
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "idle", FLOW, {"idle_tasks": "def run(ctx):\n    return True\n"})
    fr.db = pg_url
    assert fr("start", "idle").returncode == 0
    started = time.monotonic()
    res = fr("--daemon", "--exit-when-idle", "--lease", "120", timeout=120)
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    assert "1 attempt committed" in res.stderr, res.stderr
    assert took < 20, f"exited {took:.1f}s after it started"
