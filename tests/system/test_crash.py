"""Crashes, takeovers and shutdowns of real daemons on one SQLite file.

Every test drives ``flowrun --daemon`` subprocesses with real signals (SIGKILL, SIGSTOP/
SIGCONT, SIGINT) and checks the attempts table afterwards: nothing lost, nothing done
twice, lost attempts recorded as ``lost`` and counted as restarts. Progress is read from
the SQLite file; every wait polls with a generous deadline.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.store.create import create_instances
from tests.support.fault import (
    Daemon,
    Flowrun,
    engine_at,
    group_alive,
    load,
    poll,
    sql,
    unique,
    write_flow,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE = 2.0

STEPS = """\
initial: s1
defaults:
  max_restarts: 10
  backoff: {{initial: 100ms, factor: 1, max: 100ms, jitter: none}}
states:
  s1: {{call: "{mod}:step", next: s2}}
  s2: {{call: "{mod}:step", next: done}}
  done: {{terminal: true}}
"""

STEP_MODULE = """\
import asyncio


async def step(ctx):
    await asyncio.sleep({delay})
    return True
"""


class Run:
    """A flows folder with one 2-step flow, ``n`` instances and daemons to drive it."""

    def __init__(self, home: Path, n: int, delay: float) -> None:
        self.fr = Flowrun(home)
        self.name = unique("crash")
        mod = f"{self.name}_tasks"
        path = write_flow(
            self.fr.flows,
            self.name,
            STEPS.format(mod=mod),
            {mod: STEP_MODULE.format(delay=delay)},
        )
        self.db: Engine = engine_at(home)
        with self.db.begin() as conn:
            create_instances(conn, load(path), [{"i": i} for i in range(n)])
        self.n = n
        self.daemons: list[Daemon] = []

    def daemon(self, *args: str, concurrency: int = 32) -> Daemon:
        d = self.fr.daemon(
            "--concurrency",
            str(concurrency),
            *args,
            lease=LEASE,
            worker_id=unique("w"),
            log=f"daemon{len(self.daemons)}",
        )
        self.daemons.append(d)
        return d

    def moved(self) -> int:
        return sql(self.db, "SELECT count(*) FROM attempts WHERE outcome = 'moved'")[0][0]

    def completed(self) -> int:
        q = "SELECT count(*) FROM instances WHERE status = 'completed'"
        return sql(self.db, q)[0][0]

    def drain(self) -> None:
        """A fresh daemon with ``--exit-when-idle`` finishes everything and exits 0."""
        d = self.daemon("--exit-when-idle")
        code = d.wait(240)
        assert code == 0, d.log()[-3000:]

    def check_invariants(self, *, expect_lost: bool) -> None:
        """All completed, each state moved exactly once, lost attempts = restarts."""
        statuses = sql(self.db, "SELECT status, count(*) FROM instances GROUP BY status")
        assert statuses == [("completed", self.n)], statuses
        twice = sql(
            self.db,
            "SELECT instance_id, state, count(*) FROM attempts WHERE outcome = 'moved' "
            "GROUP BY instance_id, state HAVING count(*) > 1",
        )
        assert twice == [], f"instances advanced twice: {twice[:5]}"
        assert self.moved() == 2 * self.n
        assert sql(self.db, "SELECT count(*) FROM attempts WHERE outcome IS NULL") == [(0,)]
        running = "SELECT count(*) FROM instances WHERE running_attempt IS NOT NULL"
        assert sql(self.db, running) == [(0,)]
        lost = sql(self.db, "SELECT count(*) FROM attempts WHERE outcome = 'lost'")[0][0]
        restarts = sql(self.db, "SELECT coalesce(sum(restarts), 0) FROM instances")[0][0]
        assert lost == restarts, (lost, restarts)
        if expect_lost:
            assert lost > 0, "the crash lost no attempt: the test did not test anything"
        errors = sql(self.db, "SELECT count(*) FROM attempts WHERE outcome = 'error'")
        assert errors == [(0,)]
        assert sql(self.db, "SELECT count(*) FROM instances WHERE locked_by IS NOT NULL") == [(0,)]

    def cleanup(self) -> None:
        for d in self.daemons:
            d.stop()


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator:
    runs: list[Run] = []

    def make(n: int, delay: float) -> Run:
        r = Run(tmp_path / f"run{len(runs)}", n, delay)
        runs.append(r)
        return r

    yield make
    for r in runs:
        r.cleanup()


def test_kill_9_mid_run_then_recover(make_run) -> None:
    run = make_run(n=500, delay=0.05)
    d = run.daemon()
    poll(lambda: run.moved() >= 200, 120, what="progress before the crash")
    d.signal(signal.SIGKILL)
    d.wait(30)
    assert run.completed() < run.n, "the run finished before the crash"
    running = "SELECT count(*) FROM instances WHERE running_attempt IS NOT NULL"
    assert sql(run.db, running)[0][0] > 0, "the crash left no attempt running"
    run.drain()
    run.check_invariants(expect_lost=True)
    recovered = run.daemons[-1].log()
    assert "attempt lost by worker" in recovered


def test_kill_storm(make_run) -> None:
    run = make_run(n=500, delay=0.15)
    for fraction in (0.2, 0.45, 0.7):
        d = run.daemon()
        target = int(2 * run.n * fraction)
        poll(lambda t=target: run.moved() >= t, 120, what=f"{target} moves")
        d.signal(signal.SIGKILL)
        d.wait(30)
    assert run.completed() < run.n
    run.drain()
    run.check_invariants(expect_lost=True)
    lost_by = sql(run.db, "SELECT count(DISTINCT worker) FROM attempts WHERE outcome = 'lost'")[0][
        0
    ]
    assert lost_by == 3, "each killed daemon left attempts behind"


def test_sigstopped_daemon_past_its_lease_cannot_advance_anything(make_run) -> None:
    run = make_run(n=300, delay=0.1)
    a = run.daemon(concurrency=16)
    b = run.daemon(concurrency=16)
    poll(lambda: run.moved() >= 60, 120, what="both running")
    a.signal(signal.SIGSTOP)
    try:
        stopped_at = sql(run.db, "SELECT max(started_at) FROM attempts")[0][0]
        # b takes over a's instances once their leases expire (lost attempts appear)
        poll(
            lambda: sql(run.db, "SELECT count(*) FROM attempts WHERE outcome = 'lost'")[0][0] > 0,
            120,
            what="takeover",
        )
        poll(
            lambda: (
                sql(run.db, "SELECT count(*) FROM attempts WHERE started_at > :t", t=stopped_at)[0][
                    0
                ]
                > 50
            ),
            120,
            what="b keeps going",
        )
    finally:
        a.signal(signal.SIGCONT)
    poll(lambda: run.completed() == run.n, 180, what="all completed")
    for d in (a, b):
        d.signal(signal.SIGINT)
    for d in (a, b):
        assert d.wait(60) == 0, d.log()[-3000:]
    run.check_invariants(expect_lost=True)
    # a noticed on waking that its instances were taken over: it cancelled those attempts
    # or its fenced commit wrote nothing
    a_log = a.log()
    fenced = re.search(r"(\d+) outcomes? not committed", a_log)
    assert "taken away" in a_log or (fenced and int(fenced.group(1)) > 0), a_log[-2000:]


# -- shutdown -----------------------------------------------------------------------------------

SLEEP = 'if [ -e fast ]; then exit 0; fi; echo $$ > "pid.$FLOWRUN_INSTANCE.$FLOWRUN_ATTEMPT"; '
SLEEPER = f"""\
initial: work
defaults:
  max_restarts: 10
states:
  work:
    exec: [sh, -c, '{SLEEP}sleep SECS']
    next: done
  done: {{terminal: true}}
"""


def _sleeper(home: Path, n: int, secs: float) -> tuple[Flowrun, Engine]:
    fr = Flowrun(home)
    path = write_flow(fr.flows, "sleeper", SLEEPER.replace("SECS", f"{secs:g}"))
    db = engine_at(home)
    with db.begin() as conn:
        create_instances(conn, load(path), [{} for _ in range(n)])
    return fr, db


def _started(fr: Flowrun) -> list[Path]:
    return list(fr.flows.glob("pid.*"))


def test_sigint_once_is_graceful(tmp_path: Path) -> None:
    fr, db = _sleeper(tmp_path, n=20, secs=2)
    d = fr.daemon("--concurrency", "4", "--grace", "60", lease=LEASE, worker_id="graceful")
    try:
        poll(lambda: len(_started(fr)) >= 4, 60, what="4 attempts running")
        d.signal(signal.SIGINT)
        assert d.wait(60) == 0
    finally:
        d.stop()
    log = d.log()
    assert "stopping gracefully" in log and "worker graceful stopped" in log
    outcomes = dict(sql(db, "SELECT outcome, count(*) FROM attempts GROUP BY outcome"))
    assert outcomes.get(None) is None, "an attempt was left open"
    assert outcomes.get("cancelled") is None and outcomes.get("lost") is None
    assert outcomes["moved"] >= 4, "the running attempts were allowed to finish"
    assert sql(db, "SELECT count(*) FROM instances WHERE locked_by IS NOT NULL") == [(0,)]
    assert sql(db, "SELECT count(*) FROM instances WHERE running_attempt IS NOT NULL") == [(0,)]
    done = sql(db, "SELECT count(*) FROM instances WHERE status = 'completed'")[0][0]
    assert done == outcomes["moved"] < 20, "it stopped claiming"
    # a new daemon right away (no lease to wait for: the locks were released)
    (fr.flows / "fast").touch()
    d2 = fr.daemon("--exit-when-idle", lease=60, worker_id="after", log="after")
    try:
        assert d2.wait(120) == 0
    finally:
        d2.stop()
    assert sql(db, "SELECT status, count(*) FROM instances GROUP BY status") == [("completed", 20)]


def test_sigint_twice_exits_at_once_and_a_new_daemon_recovers(tmp_path: Path) -> None:
    fr, db = _sleeper(tmp_path, n=12, secs=1000)
    d = fr.daemon("--concurrency", "4", "--grace", "600", lease=LEASE, worker_id="abort")
    try:
        poll(lambda: len(_started(fr)) >= 4, 60, what="4 attempts running")
        pids = [int(p.read_text()) for p in _started(fr)]
        d.signal(signal.SIGINT)
        poll(lambda: "stopping gracefully" in d.log(), 30, what="first SIGINT logged")
        d.signal(signal.SIGINT)
        d.wait(60)  # far less than --grace 600 and the handlers' sleep 1000
    finally:
        d.stop()
    assert "again: aborting" in d.log()
    poll(lambda: not any(group_alive(p) for p in pids), 30, what="handler groups killed")
    running = "SELECT count(*) FROM instances WHERE running_attempt IS NOT NULL"
    assert sql(db, running) == [(4,)], "the abort left its 4 attempts running"
    (fr.flows / "fast").touch()
    d2 = fr.daemon("--exit-when-idle", lease=LEASE, worker_id="recover", log="recover")
    try:
        assert d2.wait(120) == 0, d2.log()[-3000:]
    finally:
        d2.stop()
    assert sql(db, "SELECT status, count(*) FROM instances GROUP BY status") == [("completed", 12)]
    lost = sql(db, "SELECT count(*) FROM attempts WHERE outcome = 'lost'")[0][0]
    assert lost == 4
    assert sql(db, "SELECT sum(restarts) FROM instances") == [(4,)]
    assert sql(db, "SELECT count(*) FROM attempts WHERE outcome IS NULL") == [(0,)]
    assert sql(db, running) == [(0,)]
