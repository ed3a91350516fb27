"""A worker is provably dead only when its row names a process of this host, this boot and
this pid namespace that is gone (pid absent, or reused: another start time). Then
``flowrun workers`` says dead at once and its instance and sensor leases are taken over at
once; a worker of another host or boot, or a row without the identity, never is."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select

from runner.ops.liveness import read_workers
from runner.sensors.events import claim_leases
from runner.store import heartbeat, host
from runner.store.db import make_engine
from runner.store.dead import dead_holders
from runner.store.leases import recover_lost
from runner.store.reader import open_sqlite
from runner.store.revision import latest_revision
from runner.store.tables import attempts, instances, sensors, workers
from tests.support.fault import policy

pytestmark = pytest.mark.skipif(host.boot_id() is None, reason="needs Linux /proc")


def _gone_pid() -> tuple[int, int]:
    """The pid and start ticks of a process that ran and was reaped."""
    proc = subprocess.Popen(["sleep", "30"])
    started = host.start_ticks(proc.pid)
    assert started is not None
    proc.kill()
    proc.wait()
    return proc.pid, started


def _row(wid: str, **identity) -> dict:
    me = host.current()
    at = time.time()
    base = {"host": me.host, "boot_id": me.boot, "pid": me.pid, "pid_started": me.started}
    return {"id": wid, "started_at": at, "heartbeat_at": at, "running": 0, **base, **identity}


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    yield engine
    engine.dispose()


def test_provably_dead_needs_this_host_boot_and_a_gone_or_reused_pid() -> None:
    me = host.current()
    pid, started = _gone_pid()
    assert host.provably_dead(me.host, me.boot, pid, started)
    assert host.provably_dead(me.host, me.boot, me.pid, me.started + 1)  # pid reused
    assert not host.provably_dead(me.host, me.boot, me.pid, me.started)  # this process
    assert not host.provably_dead("elsewhere", me.boot, pid, started)
    assert not host.provably_dead(me.host, "another-boot pid:[1]", pid, started)
    assert not host.provably_dead(me.host, None, pid, started)  # a row before 0005
    assert not host.provably_dead(me.host, me.boot, pid, None)


def test_register_records_the_process_identity(engine: Engine) -> None:
    heartbeat.register(engine, "w1", 10.0)
    with engine.connect() as conn:
        row = conn.execute(select(workers)).one()
    me = host.current()
    assert (row.host, row.boot_id, row.pid, row.pid_started) == (
        socket.gethostname(),
        me.boot,
        os.getpid(),
        me.started,
    )


def test_workers_says_dead_at_once_only_for_a_provably_dead_process(tmp_path, engine) -> None:
    pid, started = _gone_pid()
    rows = [
        _row("gone", pid=pid, pid_started=started),
        _row("reused", pid_started=host.current().started + 5),
        _row("me"),
        _row("other-host", host="elsewhere", pid=pid, pid_started=started),
        _row("other-boot", boot_id="b pid:[1]", pid=pid, pid_started=started),
        _row("old-row", boot_id=None, pid_started=None, pid=pid),
    ]
    with engine.begin() as conn:
        conn.execute(insert(workers), rows)
    want = {
        "gone": "dead",
        "reused": "dead",
        "me": "alive",
        "other-host": "alive",
        "other-boot": "alive",
        "old-row": "alive",
    }
    assert {r["id"]: r["verdict"] for r in read_workers(engine, now=time.time())} == want
    reader = open_sqlite(str(engine.url), latest_revision())  # the CLI's stdlib reader
    assert reader is not None
    try:
        got = {r["id"]: r["verdict"] for r in read_workers(reader, now=time.time())}
    finally:
        reader.close()
    assert got == want


def _instance(locked_by: str, running: int | None, until: float) -> dict:
    at = time.time()
    return {
        "flow": "f",
        "version": "v",
        "state": "a",
        "status": "runnable",
        "data": {},
        "state_errors": [],
        "created_at": at,
        "updated_at": at,
        "due_at": at,
        "locked_by": locked_by,
        "locked_until": until,
        "running_attempt": running,
        "state_attempted": at if running else None,
    }


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_engine(request, tmp_path: Path) -> Engine:
    """A SQLite file's engine, or a fresh PostgreSQL database's."""
    url = (
        f"sqlite:///{tmp_path / 'any.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    engine = make_engine(url)
    yield engine
    engine.dispose()


def test_a_dead_workers_leases_are_taken_over_at_once_and_no_one_elses(any_engine) -> None:
    engine = any_engine
    pid, started = _gone_pid()
    later = time.time() + 600  # every lease valid for ten minutes
    with engine.begin() as conn:
        conn.execute(
            insert(workers),
            [
                _row("gone", pid=pid, pid_started=started),
                _row("far", host="elsewhere", pid=pid, pid_started=started),
            ],
        )
        conn.execute(
            insert(instances),
            [
                _instance("gone", 1, later),
                _instance("gone", None, later),  # a claim not started yet
                _instance("far", 1, later),
            ],
        )
        conn.execute(
            insert(sensors),
            [
                {"name": n, "cursor": {}, "updated_at": 0, "locked_by": w, "locked_until": later}
                for n, w in (("f.mine", "gone"), ("f.theirs", "far"))
            ],
        )
    with engine.begin() as conn:
        assert dead_holders(conn, instances, "me") == ["gone"]
        lost = recover_lost(conn, lambda v, s: policy(5), me="me")
    assert [(x.worker, x.failed) for x in lost] == [("gone", False)]
    with engine.connect() as conn:
        locks = conn.execute(
            select(instances.c.id, instances.c.locked_by).order_by(instances.c.id)
        ).all()
        outcome = conn.execute(select(attempts.c.outcome, attempts.c.error)).one()
    assert locks == [(1, None), (2, None), (3, "far")]
    assert outcome[0] == "lost" and "died" in outcome[1]
    assert claim_leases(engine, ["f.mine", "f.theirs"], "me", 30.0) == {"f.mine"}
