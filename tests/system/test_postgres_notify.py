"""Wake-ups through PostgreSQL ``LISTEN/NOTIFY``: idle daemons that do not poll still pick
up new work at once, a killed listening connection loses nothing, and a restart of the
server loses nothing.

The daemons run with ``--idle-poll 0`` (no fallback look for due work while idle), so only a
notification can explain an instance being claimed; a control instance inserted WITHOUT a
notification shows that polling really is off.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import insert

from runner.store.db import make_engine
from runner.store.tables import instances
from tests.support.fault import Flowrun, poll, sql, write_flow

pytestmark = pytest.mark.postgres

FLOW = """\
initial: s1
states:
  s1: {call: "job_tasks:run", next: done}
  done: {terminal: true}
"""

TASKS = """\
def run(ctx):
    return True
"""


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _setup(tmp_path: Path, pg_url: str) -> Flowrun:
    fr = Flowrun(tmp_path)
    fr.flows.mkdir()
    write_flow(fr.flows, "job", FLOW, {"job_tasks": TASKS})
    fr.db = pg_url
    return fr


def _registered(engine, n: int) -> None:
    poll(
        lambda: sql(engine, "SELECT count(*) FROM workers WHERE stopped_at IS NULL")[0][0] >= n,
        timeout=120,
        what=f"{n} daemons registered",
    )


def _listening(pg_url: str, n: int) -> None:
    db = pg_url.rpartition("/")[2]

    def count() -> int:
        with psycopg.connect(_libpq(pg_url), autocommit=True) as c:
            row = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND query LIKE 'LISTEN %%'",
                (db,),
            ).fetchone()
            return int(row[0])

    poll(lambda: count() >= n, timeout=60, what=f"{n} listening connections")


def _start(fr: Flowrun) -> int:
    res = fr("start", "job")
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def _status(engine, iid: int) -> str:
    return sql(engine, "SELECT status FROM instances WHERE id = :i", i=iid)[0][0]


def _silent_insert(engine) -> int:
    """An instance due now, inserted WITHOUT a notification (as a stale poll would need)."""
    now = time.time()
    row = {
        "flow": "job", "version": "none", "state": "s1", "status": "runnable", "data": {},
        "due_at": now, "fence": 0, "attempts": 0, "errors": 0, "restarts": 0,
        "state_errors": [], "state_restarts": 0, "state_changed": now, "created_at": now,
        "updated_at": now,
    }  # fmt: skip
    with engine.begin() as conn:
        version = conn.exec_driver_sql("SELECT version FROM flow_versions LIMIT 1").scalar_one()
        row["version"] = version
        return conn.execute(insert(instances).returning(instances.c.id), row).scalar_one()


def test_idle_daemons_wake_on_notification_only(tmp_path, pg_url):
    fr = _setup(tmp_path, pg_url)
    engine = make_engine(pg_url)
    daemons = [fr.daemon("--idle-poll", "0", worker_id=f"d{k}", log=f"d{k}") for k in range(2)]
    try:
        _registered(engine, 2)
        _listening(pg_url, 2)
        first = _start(fr)  # also stores the flow's version
        poll(lambda: _status(engine, first) == "completed", timeout=5, what="woken by NOTIFY")
        # Control: an instance inserted without a notification is NOT picked up: no polling.
        silent = _silent_insert(engine)
        time.sleep(2.0)
        assert _status(engine, silent) == "runnable"
        # ... and the next start's notification wakes a daemon, which claims both.
        second = _start(fr)
        started = time.time()
        poll(lambda: _status(engine, second) == "completed", timeout=5, what="second start")
        assert time.time() - started < 1.0 + 1.0  # claimed within 1 s (+1 s for the poll loop)
        poll(lambda: _status(engine, silent) == "completed", timeout=5, what="silent instance")
    finally:
        for d in daemons:
            d.stop()
        engine.dispose()


def test_killed_listener_still_picks_up_later_work(tmp_path, pg_url):
    fr = _setup(tmp_path, pg_url)
    engine = make_engine(pg_url)
    daemon = fr.daemon("--idle-poll", "0", worker_id="solo")
    db = pg_url.rpartition("/")[2]
    try:
        _registered(engine, 1)
        _listening(pg_url, 1)
        with psycopg.connect(_libpq(pg_url), autocommit=True) as c:
            killed = c.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND query LIKE 'LISTEN %%'",
                (db,),
            ).fetchone()[0]
        assert killed == 1
        iid = _start(fr)
        poll(lambda: _status(engine, iid) == "completed", timeout=30, what="after reconnect")
        assert "listener: connection lost" in daemon.log()
        assert "Traceback" not in daemon.log()
    finally:
        daemon.stop()
        engine.dispose()


def _cluster() -> tuple[str, str] | None:
    if not shutil.which("pg_ctlcluster") or not Path("/etc/postgresql").is_dir():
        return None
    versions = sorted(p.name for p in Path("/etc/postgresql").iterdir())
    return (versions[0], "main") if versions else None


@pytest.mark.server_alone
def test_server_restart_loses_nothing(tmp_path, pg_url):
    cluster = _cluster()
    if cluster is None:
        pytest.skip("no local PostgreSQL cluster to restart (pg_ctlcluster not found)")
    fr = _setup(tmp_path, pg_url)
    engine = make_engine(pg_url)
    daemon = fr.daemon("--idle-poll", "0", worker_id="survivor", lease=5)
    try:
        _registered(engine, 1)
        before = [_start(fr) for _ in range(3)]
        poll(lambda: all(_status(engine, i) == "completed" for i in before), timeout=30)
        restart = ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "restart"]
        subprocess.run(restart, check=True, capture_output=True, timeout=120)
        after = [_start(fr) for _ in range(3)]
        poll(
            lambda: all(_status(engine, i) == "completed" for i in after),
            timeout=60,
            what="work created after the restart",
        )
        assert "Traceback" not in daemon.log()
    finally:
        daemon.stop()
        engine.dispose()


def test_idle_daemon_keeps_its_heartbeat(tmp_path, pg_url):
    """A worker asleep until a notification still beats (every third of its 6 s lease, as
    its row says): liveness must not call it dead."""
    from runner.ops.liveness import STALE_BEATS

    fr = _setup(tmp_path, pg_url)
    engine = make_engine(pg_url)
    daemon = fr.daemon("--idle-poll", "0", worker_id="sleeper", lease=6)
    try:
        _registered(engine, 1)
        q = "SELECT heartbeat_at, heartbeat_every FROM workers WHERE id = 'sleeper'"
        first, every = sql(engine, q)[0]
        assert every == 2.0
        time.sleep(STALE_BEATS * every + 1.0)
        beat = sql(engine, q)[0][0]
        assert beat > first
        assert time.time() - beat < STALE_BEATS * every
    finally:
        daemon.stop()
        engine.dispose()
