"""The worker's database cycle, tested directly on a real SQLite file with real compiled
flows: what one ``cycle.run_cycle`` commits, chains, claims and reports, and what the
worker does when the database cannot be reached (``Worker.run_single_cycle``).

The attempts' results are built by hand (``AttemptResult``); no handler runs except in
the last test, where one real ``call`` handler runs through the worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine.config import WorkerConfig
from runner.engine.cycle import (
    MAX_CHAIN,
    CycleRequest,
    CycleResult,
    WorkerStats,
    decide_finished,
    run_cycle,
    run_inline,
)
from runner.engine.db_thread import DatabaseThread
from runner.engine.running import Running
from runner.engine.timers import LoopingTimer, OutageBackoff, OutageLog
from runner.engine.worker import Worker
from runner.flowspec.compiled import CompiledFlow
from runner.handlers.attempt import AttemptResult, Cancel
from runner.store import leases
from runner.store.db import make_engine, no_wait_engine
from runner.store.rows import Claim
from tests.support.fault import attempts_of, flow_world, load, new_instance, row, write_flow

LEASE = 30.0  # seconds

FLOW = """\
initial: a
defaults:
  max_restarts: 1
  backoff: {initial: 60s, factor: 1, max: 60s, jitter: none}
states:
  a: {exec: [python, -c, "pass"], to: [b, done]}
  b: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


@pytest.fixture
def world(tmp_path: Path) -> tuple[Engine, CompiledFlow]:
    return flow_world(tmp_path, "cy", FLOW)


def finished(claim: Claim, outcome: str, to_state: str | None = None, error: str | None = None):
    """A finished attempt as the worker hands it to its cycle: ``(run, result)``."""
    run = Running(claim, None, Cancel(), [claim.data])  # type: ignore[arg-type]
    return run, AttemptResult(outcome, claim.data, to_state=to_state, error=error)


def cycle(
    engine: Engine,
    batch=(),
    *,
    free: int = 0,
    worker: str = "w1",
    lease: float = LEASE,
    probe: bool = False,
    recover: bool = False,
    stopping: bool = False,
) -> CycleResult:
    """One cycle as the worker runs it: decide the finished attempts, then the transaction."""
    request = CycleRequest(worker, lease, free, probe, recover)
    return run_cycle(engine, decide_finished(engine, list(batch), request, stopping=stopping))


def test_a_cycle_commits_finished_attempts_and_claims_the_next_batch(world) -> None:
    engine, flow = world
    first, second, third = (new_instance(engine, flow, {"n": n}) for n in range(3))
    got = cycle(engine, free=2)
    assert [c.id for c in got.claims] == [first, second] and got.claimed_all
    assert (got.limit, got.committed, got.chained, got.lost) == (2, 0, [], [])
    assert attempts_of(engine, first) == [], "an attempt's row is written when it ends"
    one, two = got.claims

    got = cycle(
        engine, [finished(one, "moved", "done"), finished(two, "error", error="boom")], free=1
    )
    assert [c.id for c in got.claims] == [third] and got.claimed_all
    assert (got.committed, got.cancelled, got.chained, got.lost) == (2, 0, [], [])
    done, failed = row(engine, first), row(engine, second)
    assert (done["state"], done["status"], done["locked_by"]) == ("done", "completed", None)
    assert (failed["state"], failed["status"], failed["errors"]) == ("a", "sleeping", 1)
    assert failed["locked_by"] is None and failed["due_at"] > time.time() + 30, "backoff 60 s"
    [a1], [a2] = attempts_of(engine, first), attempts_of(engine, second)
    assert (a1["outcome"], a1["to_state"], a1["worker"]) == ("moved", "done", "w1")
    assert (a2["outcome"], a2["error"]) == ("error", "boom")
    assert (row(engine, third)["locked_by"], row(engine, third)["running_attempt"]) == ("w1", 1)

    got = cycle(engine, free=3)
    assert (got.claims, got.limit, got.claimed_all) == ([], 3, False), "nothing else is due"


def test_a_runnable_successor_chains_without_a_new_claim(world) -> None:
    engine, flow = world
    iid, other = new_instance(engine, flow), new_instance(engine, flow)
    one, two = cycle(engine, free=2).claims
    fence = row(engine, iid)["fence"]

    got = cycle(engine, [finished(one, "moved", "b")], free=1)
    assert got.claims == [] and got.limit == 0, "the chained move took the only free slot"
    [nxt] = got.chained
    assert (nxt.id, nxt.state, nxt.attempt, nxt.chain, nxt.fence) == (iid, "b", 2, 1, fence)
    r = row(engine, iid)
    assert (r["state"], r["locked_by"], r["running_attempt"]) == ("b", "w1", 2), "still ours"
    [a1] = attempts_of(engine, iid)
    assert (a1["outcome"], a1["to_state"]) == ("moved", "b")

    # a stopping worker (no free slots) chains nothing: the instance is released, due in b
    got = cycle(engine, [finished(two, "moved", "b")], stopping=True)
    assert (got.chained, got.claims, got.committed) == ([], [], 1)
    r = row(engine, other)
    assert (r["state"], r["status"], r["locked_by"], r["running_attempt"]) == (
        "b",
        "runnable",
        None,
        None,
    )


def test_chains_stop_after_max_chain_moves(world) -> None:
    engine, flow = world
    iid = new_instance(engine, flow)
    [claim] = cycle(engine, free=1).claims
    claim.chain = MAX_CHAIN  # as if it had moved MAX_CHAIN times since it was claimed
    got = cycle(engine, [finished(claim, "moved", "b")], free=1)
    assert got.chained == [], "released instead"
    assert [c.id for c in got.claims] == [iid], "and claimed anew in the same cycle"
    assert got.claims[0].chain == 0 and got.claims[0].fence > claim.fence


def test_a_cycle_reports_lost_attempts(world) -> None:
    """A dead worker's attempt is recovered (``recovered``); when that worker comes back
    and commits it anyway, the fence has moved: nothing is written (``lost``)."""
    engine, flow = world
    iid = new_instance(engine, flow, {"v": 1})
    [stale] = cycle(engine, free=1, worker="dead", lease=0.05).claims
    time.sleep(0.2)  # its lease runs out: it stopped renewing it

    got = cycle(engine, free=1, worker="w2", recover=True)
    assert got.recovered == [leases.Lost(iid, 1, "dead", failed=False)]
    [taken] = got.claims
    assert (taken.id, taken.attempt) == (iid, 2) and taken.fence > stale.fence

    late = cycle(engine, [finished(stale, "moved", "done")], worker="dead")
    assert (late.lost, late.committed) == ([iid], 0)
    r = row(engine, iid)
    assert (r["state"], r["locked_by"], r["running_attempt"], r["data"]) == ("a", "w2", 2, {"v": 1})
    [lost] = attempts_of(engine, iid)
    assert (lost["outcome"], lost["worker"]) == ("lost", "dead")

    stats = WorkerStats()
    for result in (got, late):
        stats.add(result)
    assert stats.items() == [
        ("claimed", 1),
        ("chained", 0),
        ("committed", 0),
        ("cancelled", 0),
        ("lost_fence", 1),
        ("recovered", 1),
        ("handed", 0),
    ]


def test_cancelled_attempts_are_closed_and_counted(world) -> None:
    engine, flow = world
    iid = new_instance(engine, flow)
    [claim] = cycle(engine, free=1).claims
    got = cycle(engine, [finished(claim, "cancelled", error="cancelled: paused")])
    assert (got.committed, got.cancelled, got.lost) == (1, 1, [])
    [a] = attempts_of(engine, iid)
    assert (a["outcome"], a["error"]) == ("cancelled", "cancelled: paused")
    assert row(engine, iid)["locked_by"] is None


def test_an_idle_probe_claims_only_what_is_due(world) -> None:
    engine, flow = world
    assert cycle(engine, free=4, probe=True) == CycleResult(), "nothing due: an empty answer"
    iid = new_instance(engine, flow)
    got = cycle(engine, free=4, probe=True)
    assert [c.id for c in got.claims] == [iid] and not got.claimed_all


def test_a_cycle_on_an_unreachable_database_raises_and_backs_off(tmp_path, caplog) -> None:
    gone = make_engine(f"sqlite:///{tmp_path / 'db' / 'x.db'}", create=False)
    no_wait = no_wait_engine(gone)
    (tmp_path / "db").rmdir()  # the database's folder is gone: it cannot be opened
    with pytest.raises(DBAPIError):
        run_cycle(gone, CycleRequest("w1", LEASE, free=4))

    async def inline() -> None:  # on the loop, an outage is an error, not a busy lock
        fut = run_inline(asyncio.get_running_loop(), no_wait, CycleRequest("w1", 1, free=4))
        assert fut is not None and fut.done() and isinstance(fut.exception(), DBAPIError)

    asyncio.run(inline())

    backoff = OutageBackoff()
    with caplog.at_level(logging.WARNING, logger="flowrun.worker"):
        try:
            run_cycle(gone, CycleRequest("w1", LEASE, free=4))
        except DBAPIError as exc:
            delays = [backoff.fail(exc) for _ in range(7)]
        backoff.ok()
        backoff.ok()
    assert delays == [0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]  # capped: resume within 2 s
    lines = [r.getMessage() for r in caplog.records]
    # the first failure is logged, repeats at most every OutageLog.QUIET seconds
    assert len(lines) == 2 and lines[-1] == "database reachable again"
    assert "unable to open database file" in lines[0]
    assert not any(r.exc_info for r in caplog.records), "one line, no traceback"


def test_one_outage_is_one_line_however_many_calls_fail(tmp_path, caplog, monkeypatch) -> None:
    """The worker's guarded calls (heartbeat, renewals, fence checks: several a second
    while it stops) and its backoff share one OutageLog: the first failure is a line,
    the others are folded into the next line, at most every QUIET seconds."""
    gone = make_engine(f"sqlite:///{tmp_path / 'db' / 'x.db'}", create=False)
    (tmp_path / "db").rmdir()  # the database's folder is gone: it cannot be opened

    def touch(engine: Engine) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql("SELECT 1")

    async def outage() -> None:
        db = DatabaseThread()
        backoff = OutageBackoff(db.said)
        try:
            for _ in range(12):  # as a stopping worker's chores, 4 a second for 3 s
                assert await db.guard(touch, gone) is None
            with pytest.raises(DBAPIError):
                await db.call(touch, gone)
            monkeypatch.setattr(OutageLog, "QUIET", 0.0)  # as if 30 s had passed
            try:
                await db.call(touch, gone)
            except DBAPIError as exc:
                backoff.fail(exc)
            await db.guard(touch, make_engine(f"sqlite:///{tmp_path / 'x.db'}"))
        finally:
            db.shutdown()

    with caplog.at_level(logging.WARNING, logger="flowrun.worker"):
        asyncio.run(outage())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("database unavailable (") and "more failures" not in lines[0]
    assert lines[1].endswith(
        "; retrying every 0.5s (1 failures) (11 more failures since the last line)"
    )
    assert lines[2] == "database reachable again"


def test_looping_timer() -> None:
    timer = LoopingTimer(0.5, now=10.0)
    assert timer.due(10.0) and timer.check(10.0), "due at once"
    assert not timer.check(10.4) and timer.next_at == 10.5
    assert timer.check(10.6) and timer.next_at == pytest.approx(11.1)
    timer.restart(20.0)
    assert not timer.due(20.1) and timer.due(20.5)


HANDLER = "async def ok(ctx):\n    return True\n"


def test_the_worker_keeps_finished_attempts_while_the_database_is_away(tmp_path: Path) -> None:
    """``Worker.run_single_cycle``: claim and run one attempt; while the database cannot
    be opened the cycle fails and the finished attempt is kept; once it is back the
    next cycle commits it."""
    flow = load(
        write_flow(
            tmp_path / "flows",
            "wk",
            "initial: a\nstates:\n  a: {call: 'cy_ok:ok', next: done}\n  done: {terminal: true}\n",
            {"cy_ok": HANDLER},
        )
    )
    home = tmp_path / "home"
    engine = make_engine(f"sqlite:///{home / 'w.db'}")
    iid = new_instance(engine, flow)
    ticks: list[float] = []
    cfg = WorkerConfig(worker_id="w1", concurrency=2, on_tick=lambda: ticks.append(1.0))
    worker = Worker(engine, cfg)

    async def main() -> None:
        got = await worker.run_single_cycle()
        assert [c.id for c in got.claims] == [iid] and list(worker.running) == [iid]
        deadline = time.monotonic() + 60
        while worker.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(worker.attempts.finished) == 1
        engine.dispose()
        home.rename(tmp_path / "away")
        with pytest.raises(DBAPIError):
            await worker.run_single_cycle()
        assert len(worker.attempts.finished) == 1, "kept for the next cycle"
        (tmp_path / "away").rename(home)
        got = await worker.run_single_cycle()
        assert (got.committed, got.lost, worker.attempts.finished) == (1, [], [])
        worker.request_stop()
        await worker.run()  # nothing left: it signs off at once

    asyncio.run(main())
    assert row(engine, iid)["status"] == "completed"
    assert dict(worker.stats.items()) == {
        "claimed": 1,
        "chained": 0,
        "committed": 1,
        "cancelled": 0,
        "lost_fence": 0,
        "recovered": 0,
        "handed": 0,
    }
    assert ticks == [1.0], "run_single_cycle is no turn of the loop; run() took one turn"
