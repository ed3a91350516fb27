"""Claims ahead of the free slots (``--prefetch``, ``runner.engine.ahead``), on a real
SQLite file and on the real PostgreSQL server: an instance claimed ahead starts when a slot
frees (its ``attempts.started_at`` is then), a graceful stop gives back those not started
(nothing lost, no trace), pause and kill cancel a waiting one before it starts, one not
started in time is given back, and the claims of a worker that died are taken over by
another worker once their lease expired, without running anything twice.

The worker runs in-process (``Worker.run``); how many it claims ahead depends on how fast
its attempts end (``ClaimAhead.target``), so each test sets that number itself (a real
timing would make them flaky on a loaded machine). Handlers log every start to a file and
block on a gate file the test creates; every wait polls with a generous deadline.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.engine import ahead
from runner.engine.config import WorkerConfig
from runner.engine.worker import Worker
from runner.errors import ConfigError
from runner.flowspec.compiled import CompiledFlow
from runner.ops import commands
from runner.store.db import make_engine
from tests.support.fault import attempts_of, load, new_instance, row, unique, until, write_flow

TASKS = """\
import asyncio
import pathlib

PEAK = [0, 0]  # [running now, most at once]


async def run(ctx):
    with open(ctx.data["log"], "a") as f:
        f.write(f"{ctx.instance_id}\\n")
    PEAK[0] += 1
    PEAK[1] = max(PEAK)
    try:
        gate = pathlib.Path(ctx.data["gate"])
        while not gate.exists():
            await asyncio.sleep(0.01)
        await asyncio.sleep(ctx.data.get("sleep", 0))
    finally:
        PEAK[0] -= 1
    return True
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request, tmp_path: Path):
    """A real database: a SQLite file, or a fresh PostgreSQL database (``pg_url``)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ahead.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    eng = make_engine(url)
    yield eng
    eng.dispose()


class World:
    """A flow whose handler logs its start and waits for the gate; instances of it."""

    def __init__(self, tmp: Path, engine: Engine) -> None:
        self.engine = engine
        self.module = unique("ahead_tasks")
        body = f'initial: a\nstates:\n  a: {{call: "{self.module}:run", next: done}}\n'
        body += "  done: {terminal: true}\n"
        self.flow: CompiledFlow = load(write_flow(tmp / "flows", "ah", body, {self.module: TASKS}))
        self.gate = tmp / "gate"
        self.log = tmp / "starts.log"
        self.knob: dict = {}

    def create(self, n: int, **data) -> list[int]:
        base = {"gate": str(self.gate), "log": str(self.log), **data}
        return [new_instance(self.engine, self.flow, dict(base)) for _ in range(n)]

    def starts(self) -> list[int]:
        """The instance ids whose handler started, once per start."""
        if not self.log.exists():
            return []
        return [int(x) for x in self.log.read_text().split()]

    def peak(self) -> int:
        """The most handlers that ran at once."""
        return sys.modules[self.module].PEAK[1]


def claim_ahead(monkeypatch, n: dict) -> None:
    """Every worker claims ``n["ahead"]`` ahead (at most its ``prefetch``)."""
    monkeypatch.setattr(
        ahead.ClaimAhead, "target", lambda self, now, ends: min(self.limit, n["ahead"])
    )


def worker(engine: Engine, **kw) -> Worker:
    cfg = WorkerConfig(**{"worker_id": "w1", "lease": 30.0, **kw})
    w = Worker(engine, cfg)
    w.attempts.start_within = 3600.0  # waiting claims are given back only when a test says
    return w


def blocked(tmp, engine, monkeypatch, n: int, ahead_: int, **kw) -> tuple[World, list, Worker]:
    """``n`` instances behind a closed gate and a worker of one slot claiming ``ahead_``
    ahead (``kw``: more ``WorkerConfig``); the number claimed ahead is ``knob["ahead"]``."""
    claim_ahead(monkeypatch, knob := {"ahead": ahead_})
    world = World(tmp, engine)
    world.knob = knob
    return world, world.create(n), worker(engine, concurrency=1, prefetch=ahead_, **kw)


async def waiting(w: Worker, n: int) -> asyncio.Task:
    """Run ``w`` as a task until ``n`` claims wait behind its busy slot; the task."""
    task = asyncio.create_task(w.run())
    await until(lambda: len(w.attempts.waiting) == n, f"{n} claimed ahead")
    return task


def drain(engine: Engine, **kw) -> Worker:
    """Run a worker that claims nothing ahead until nothing is left."""
    w = Worker(engine, WorkerConfig(worker_id="w2", exit_when_idle=True, prefetch=0, **kw))
    asyncio.run(w.run())
    return w


def unclaimed(engine: Engine, iid: int) -> bool:
    r = row(engine, iid)
    return r["locked_by"] is None and r["running_attempt"] is None and r["attempts"] == 0


def test_the_claim_ahead_target_follows_the_ends_of_the_last_window() -> None:
    """``ClaimAhead.target``: as many as ended in the current or the previous window, at
    most the limit; nothing once a whole window passed without an end; 0 if disabled."""
    c = ahead.ClaimAhead(8)
    w = ahead.WINDOW
    assert c.target(0.0, 0) == 0
    assert c.target(0.1 * w, 3) == 3
    assert c.target(0.5 * w, 20) == 8, "at most the limit"
    assert c.target(1.1 * w, 22) == 8, "the previous window had 22"
    assert c.target(2.2 * w, 24) == 2, "the previous window had 2"
    assert c.target(2.5 * w, 25) == 2
    assert c.target(3.5 * w, 25) == 1, "the previous window had 1"
    assert c.target(6.0 * w, 25) == 0, "no end for a whole window"
    assert ahead.ClaimAhead(0).target(0.1, 100) == 0


def test_no_claim_ahead_for_a_window_after_a_limit_refused_claims() -> None:
    """``ClaimAhead.refused``: a claim ahead would hold a full pool's seat, so none is
    made for :data:`ahead.WINDOW` after a cycle's claims were refused; then as before."""
    c = ahead.ClaimAhead(8)
    w = ahead.WINDOW
    assert c.target(0.1 * w, 5) == 5
    c.refused(0.2 * w)
    assert c.target(0.3 * w, 6) == 0 and c.target(1.1 * w, 7) == 0
    assert c.target(1.3 * w, 9) == 4, "then as before: the ends since the last mark"


def test_claimed_ahead_instances_start_as_slots_free(tmp_path, engine, monkeypatch) -> None:
    """Concurrency 2, two claimed ahead: the waiting ones run once each, never more than
    two at once, and their attempt's ``started_at`` is when the handler started, after
    the claim (``state_attempted``)."""
    claim_ahead(monkeypatch, {"ahead": 2})
    world = World(tmp_path, engine)
    ids = world.create(8, sleep=0.05)
    world.gate.touch()
    w = worker(engine, concurrency=2, prefetch=2, exit_when_idle=True)
    waited: set[int] = set()

    async def main() -> None:
        task = asyncio.create_task(w.run())
        while not task.done():
            waited.update(w.attempts.waiting)
            await asyncio.sleep(0.005)
        await task

    asyncio.run(main())
    assert waited, "some instances waited, claimed ahead"
    assert sorted(world.starts()) == ids, "each ran once"
    assert world.peak() <= 2, "never more than --concurrency at once"
    for iid in ids:
        r, (a,) = row(engine, iid), attempts_of(engine, iid)
        assert (r["status"], a["outcome"], a["attempt"]) == ("completed", "moved", 1)
        if iid in waited:
            assert a["started_at"] > r["state_attempted"], "started after its claim"
    assert w.stats.claimed == 8 and w.stats.committed == 8


def test_a_graceful_stop_gives_back_the_claims_not_started(tmp_path, engine, monkeypatch):
    """A stop gives the waiting claims back at once (unlocked, attempt count as before,
    no attempt row: nothing ran) while the running attempt finishes; another worker
    then runs each of them once, as attempt 1."""
    world, (first, *rest), w = blocked(tmp_path, engine, monkeypatch, 4, 3)

    async def main() -> None:
        task = await waiting(w, 3)
        assert list(w.running) == [first] and all(not unclaimed(engine, i) for i in rest)
        w.request_stop()
        await until(lambda: all(unclaimed(engine, i) for i in rest), "claims given back")
        assert not task.done() and list(w.running) == [first], "the running one runs on"
        world.gate.touch()
        await task

    asyncio.run(main())
    assert world.starts() == [first]
    assert row(engine, first)["status"] == "completed"
    for iid in rest:
        assert attempts_of(engine, iid) == [], "nothing ran: no attempt row"
        assert row(engine, iid)["status"] == "runnable"
    drain(engine)
    assert sorted(world.starts()) == [first, *rest], "each ran once"
    for iid in rest:
        assert [a["attempt"] for a in attempts_of(engine, iid)] == [1]
        assert row(engine, iid)["status"] == "completed"


def test_pause_and_kill_cancel_a_waiting_claim(tmp_path, engine, monkeypatch) -> None:
    """A waiting instance paused or killed never starts: its attempt is closed
    ``cancelled`` (no restart spent) and its lock released; resumed, it runs."""
    world, ids, w = blocked(tmp_path, engine, monkeypatch, 4, 3, exit_when_idle=True)
    first, paused, killed, last = ids

    async def main() -> None:
        task = await waiting(w, 3)
        for iid, command in ((paused, "pause"), (killed, "kill")):
            (result,) = commands.submit(engine, [iid], command)
            assert result.ok, result.message
        await until(
            lambda: paused not in w.attempts.waiting and killed not in w.attempts.waiting,
            "the fence check saw the commands",
        )
        world.gate.touch()
        await task

    asyncio.run(main())
    assert sorted(world.starts()) == [first, last], "the paused and killed ones never started"
    for iid, status in ((paused, "paused"), (killed, "killed")):
        r, (a,) = row(engine, iid), attempts_of(engine, iid)
        assert (r["status"], r["locked_by"], r["running_attempt"]) == (status, None, None)
        assert a["outcome"] == "cancelled" and a["error"].startswith("cancelled before it")
        assert r["restarts"] == 0
    (result,) = commands.submit(engine, [paused], "resume")
    assert result.ok, result.message
    drain(engine)
    assert [a["outcome"] for a in attempts_of(engine, paused)] == ["cancelled", "moved"]
    assert row(engine, paused)["status"] == "completed"
    assert sorted(world.starts()) == sorted([first, last, paused])


def test_a_claim_not_started_in_time_is_given_back(tmp_path, engine, monkeypatch) -> None:
    """While every slot stays busy, claims that waited longer than ``start_within``
    are given back (unlocked, no trace) for any worker to take."""
    world, (first, *rest), w = blocked(tmp_path, engine, monkeypatch, 3, 2)

    async def main() -> None:
        task = await waiting(w, 2)
        world.knob["ahead"] = 0  # attempts stopped ending: claim nothing more ahead
        w.attempts.start_within = 0.2
        await until(lambda: all(unclaimed(engine, i) for i in rest), "claims given back")
        assert not w.attempts.waiting and list(w.running) == [first]
        world.gate.touch()
        w.request_stop()
        await task

    asyncio.run(main())
    assert world.starts() == [first]
    drain(engine)
    assert sorted(world.starts()) == [first, *rest]
    for iid in rest:
        assert [a["outcome"] for a in attempts_of(engine, iid)] == ["moved"]


def test_claims_of_a_dead_worker_are_taken_over_once(tmp_path, engine, monkeypatch) -> None:
    """A worker aborted (as if killed) leaves its running and waiting claims; once
    their lease expired another worker records them ``lost`` and runs them. The waiting
    ones had never started: each handler ran once in all."""
    world, (first, *rest), w = blocked(tmp_path, engine, monkeypatch, 3, 2, lease=2.0)

    async def main() -> None:
        task = await waiting(w, 2)
        w.request_stop()
        w.request_stop()  # abort: nothing is released, as if the process died
        await task

    asyncio.run(main())
    assert world.starts() == [first]
    assert all(row(engine, i)["locked_by"] == "w1" for i in rest), "left claimed"
    world.gate.touch()
    drain(engine, lease=2.0)
    starts = world.starts()
    for iid in rest:
        assert starts.count(iid) == 1, "a waiting claim never ran in the dead worker"
        assert [a["outcome"] for a in attempts_of(engine, iid)] == ["lost", "moved"]
        assert row(engine, iid)["status"] == "completed"
    assert starts.count(first) == 2, "the running one was cut short, then run again"


def test_prefetch_defaults_to_the_concurrency_on_postgresql(tmp_path, engine) -> None:
    """``--prefetch`` reaches the worker; unset, it claims ahead at most ``--concurrency``
    on PostgreSQL and nothing on SQLite; 0 never claims ahead; above 0 on SQLite, refused."""
    from runner.cli.context import Ctx, WorkerOptions, worker_config

    c = Ctx(tmp_path / "flows", engine.url.render_as_string(hide_password=False), 30.0)
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:  # refused there (a stopped daemon holding claims ahead: docs/cli.md)
        c.worker_options = WorkerOptions(concurrency=3, prefetch=5)
        with pytest.raises(ConfigError, match="--prefetch 5: not on SQLite"):
            worker_config(c)
    for given, limit in ((None, 0 if sqlite else 3), (0, 0), *(() if sqlite else ((5, 5),))):
        c.worker_options = WorkerOptions(concurrency=3, prefetch=given, grace=1.0)
        cfg = worker_config(c)
        assert cfg.prefetch == given
        w = Worker(engine, cfg)
        assert w._room.ahead.limit == limit
        w.cycles.close()
        w.attempts.close()


def test_prefetch_on_sqlite_is_refused_with_one_line(tmp_path) -> None:
    """``flowrun --daemon --prefetch N`` (or ``FLOWRUN_PREFETCH``) on SQLite: exit 2, one
    line, nothing created; ``--prefetch 0`` is accepted."""
    import os
    import subprocess

    (tmp_path / "flows").mkdir()
    db = tmp_path / "ahead.db"
    base = [sys.executable, "-m", "runner.cli", "--db", f"sqlite:///{db}", "--flows", "flows"]
    env = {**os.environ, "FLOWRUN_PREFETCH": "8"}
    for argv, environ in ((["--prefetch", "8", "--daemon"], os.environ), (["--daemon"], env)):
        res = subprocess.run(
            base + argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 2, res.stderr
        assert res.stderr.splitlines() == [
            "flowrun: --prefetch 8: not on SQLite (a daemon stopped while it holds claims ahead "
            "can keep the others from taking over; see docs/cli.md); use 0 or leave it out"
        ]
        assert not db.exists()
    ok = subprocess.run(
        [*base, "--prefetch", "0", "--daemon", "--exit-when-idle"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
