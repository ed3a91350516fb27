"""Two database cycles in flight (``runner.engine.cycle_runner``), on the real PostgreSQL
server: the claims of two cycles never overlap, an outcome is committed by one cycle while
the other is in flight, an instance taken away while its outcome is in flight is not
written (its fence moved), and one worker, or two side by side, draining a backlog with
two cycles in flight run every instance exactly once. On SQLite, and with a pool of one
connection, a worker keeps one cycle in flight.

The cycle in flight is held mid-transaction by a row lock the test takes on one of the
instances it commits (a real lock on the real server, released by the test): no timing
decides what a test sees.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from runner.engine import cycle
from runner.engine.config import WorkerConfig
from runner.engine.worker import Worker
from runner.flowspec.compiled import CompiledFlow
from runner.store.db import make_engine
from tests.support.fault import attempts_of, load, new_instance, row, unique, until, write_flow

TASKS = "async def run(ctx):\n    return True\n"


def _flow(tmp: Path) -> CompiledFlow:
    module = unique("overlap_tasks")
    body = f'initial: a\nstates:\n  a: {{call: "{module}:run", next: done}}\n'
    body += "  done: {terminal: true}\n"
    return load(write_flow(tmp / "flows", "ov", body, {module: TASKS}))


def _lock_waiters(engine: Engine) -> int:
    """Backends of this database waiting for a row lock (a cycle held by the test)."""
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
        ).scalar_one()


@pytest.fixture
def pg(pg_url) -> Engine:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def side(pg_url, pg) -> Engine:
    """Another engine on the same database: the test's own connections, outside the
    worker's pool of two (both may be in the worker's cycles)."""
    eng = make_engine(pg_url, create=False)
    yield eng
    eng.dispose()


@pytest.mark.postgres
def test_two_cycles_in_flight_claim_distinct_rows_and_fence_each_outcome(tmp_path, pg, side):
    """Cycle A commits i1 and claims one; the test holds i1's row lock, so A waits in
    flight while cycle B commits i2 and claims one: B commits at once and claims i3, not
    a row A may claim. Meanwhile i1 is taken away (another worker, a new fence) in the
    test's transaction; once it commits, A's fenced commit writes nothing to i1 (reported
    lost) and A claims i4: never a row B holds."""
    flow = _flow(tmp_path)
    ids = [new_instance(pg, flow, {}) for _ in range(4)]
    i1, i2, i3, i4 = ids

    async def main() -> None:
        w = Worker(pg, WorkerConfig(worker_id="w0", lease=30.0, concurrency=2, prefetch=0))
        assert w.cycles.most == 2
        first = await w.run_single_cycle()
        assert sorted(c.id for c in first.claims) == [i1, i2]
        await until(lambda: len(w.attempts.finished) == 2, "both attempts ended")
        ended = {run.claim.id: (run, res) for run, res in w.attempts.take()}
        holder = side.connect()
        holder.begin()
        holder.execute(text("SELECT id FROM instances WHERE id = :i FOR UPDATE"), {"i": i1})
        try:
            w.attempts.finished = [ended[i1]]
            a = w.cycles.submit(w._request(1))
            await until(lambda: _lock_waiters(side) == 1, "cycle A waits for i1's row lock")
            assert not a.done() and w.cycles.can_submit()
            w.attempts.finished = [ended[i2]]
            b = w.cycles.submit(w._request(1))
            assert not w.cycles.can_submit()
            got_b = await asyncio.wait_for(asyncio.shield(b), 60)
            assert not a.done(), "A is still in flight: B committed and claimed meanwhile"
            assert (got_b.committed, got_b.lost, [c.id for c in got_b.claims]) == (1, [], [i3])
            holder.execute(
                text("UPDATE instances SET locked_by = 'w9', fence = fence + 1 WHERE id = :i"),
                {"i": i1},
            )
            holder.commit()
        finally:
            holder.close()
        got_a = await asyncio.wait_for(asyncio.shield(a), 60)
        assert got_a.lost == [i1] and [c.id for c in got_a.claims] == [i4]
        assert w.cycles.overlapped == 1
        for _ in range(2):
            w.cycles.collect()
        assert w.cycles.flights == []
        w.cycles.close()
        w._db.shutdown()
        w.attempts.close()

    asyncio.run(main())
    assert (row(pg, i2)["status"], row(pg, i2)["state"]) == ("completed", "done")
    assert [a["outcome"] for a in attempts_of(pg, i2)] == ["moved"]
    taken = row(pg, i1)
    assert (taken["state"], taken["locked_by"]) == ("a", "w9"), "nothing written to i1"
    held = {i: row(pg, i) for i in (i3, i4)}
    assert all(r["locked_by"] == "w0" and r["running_attempt"] == 1 for r in held.values())


@pytest.mark.postgres
def test_a_worker_with_two_cycles_in_flight_runs_each_instance_once(tmp_path, pg):
    """A backlog of no-op instances drained by one worker at concurrency 64: cycles
    overlapped, the worker never held more than its slots and claims ahead (``--prefetch``,
    by default as many), and every instance completed with exactly one attempt (none
    claimed twice, none lost, none cancelled)."""
    flow = _flow(tmp_path)
    n = 1500
    ids = [new_instance(pg, flow, {"k": k}) for k in range(n)]

    peak = [0]
    cfg = WorkerConfig(worker_id="w0", lease=30.0, concurrency=64, exit_when_idle=True)
    w = Worker(pg, cfg)
    submit = w.cycles.submit

    def counted(request):  # the most instances held or asked for at once
        fut = submit(request)
        asked = sum(f.request.free for f in w.cycles.flights)
        peak[0] = max(peak[0], asked + len(w.running) + len(w.attempts.waiting))
        return fut

    w.cycles.submit = counted
    asyncio.run(asyncio.wait_for(w.run(), 300))
    assert w.cycles.overlapped > 0, "the second cycle never started"
    assert peak[0] <= 64 + 64, "never more than the slots and the claims ahead"
    assert (w.stats.claimed, w.stats.committed, w.stats.lost_fence) == (n, n, 0)
    _each_ran_once(pg, len(ids))


@pytest.mark.postgres
def test_two_workers_with_two_cycles_each_run_each_instance_once(tmp_path, pg, pg_url):
    """Two workers (each its own engine and pool, as two daemons), each overlapping its
    cycles, drain one backlog: four transactions claim and commit side by side, and every
    instance still ran exactly once."""
    flow = _flow(tmp_path)
    n = 2000
    for k in range(n):
        new_instance(pg, flow, {"k": k})
    engines = [make_engine(pg_url, create=False) for _ in range(2)]
    workers = [
        Worker(e, WorkerConfig(worker_id=f"w{k}", lease=30.0, concurrency=64, exit_when_idle=True))
        for k, e in enumerate(engines)
    ]

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers)), 300)

    try:
        asyncio.run(main())
    finally:
        for e in engines:
            e.dispose()
    assert sum(w.cycles.overlapped for w in workers) > 0, "no cycle overlapped"
    assert sum(w.stats.claimed for w in workers) == n
    assert sum(w.stats.lost_fence for w in workers) == 0
    _each_ran_once(pg, n)


@pytest.mark.postgres
def test_a_wake_up_while_a_cycle_is_in_flight_is_not_lost(tmp_path, pg, monkeypatch):
    """A worker woken only by notifications (no idle look) commits A in a cycle whose
    claim found nothing; before its result reaches the loop (held by the test), N is
    created and its notification taken by the loop. When the cycle's result comes, the
    worker still claims: N runs (the claim of the cycle in flight could not see N)."""
    flow = _flow(tmp_path)
    real = cycle.run_cycle
    gate, held = threading.Event(), threading.Event()
    armed = [False]

    def slow(engine, request):  # the cycle committing A: done, its result held back
        result = real(engine, request)
        if armed[0] and request.outcomes:
            armed[0] = False
            held.set()
            gate.wait(120)
        return result

    monkeypatch.setattr(cycle, "run_cycle", slow)
    cfg = WorkerConfig(worker_id="w0", lease=300.0, concurrency=4, listen=True, idle_poll=0)
    w = Worker(pg, cfg)

    async def main() -> int:
        task = asyncio.create_task(w.run())
        try:
            await until(lambda: w.stats.committed == 0 and not w.cycles.flights, "started")
            armed[0] = True
            new_instance(pg, flow, {})
            w.notify_due(None)
            await until(held.is_set, "the cycle committing A is in flight, its claim done")
            n = new_instance(pg, flow, {})
            w.notify_due(None)
            await until(lambda: not w._wake.poked, "the loop took N's wake-up")
            gate.set()
            # at once; without the claim, N would wait for A's lease to expire (300 s)
            await until(lambda: attempts_of(pg, n), "N ran", timeout=30)
            return n
        finally:
            gate.set()
            w.request_stop()
            await asyncio.wait_for(task, 60)

    n = asyncio.run(main())
    assert [a["outcome"] for a in attempts_of(pg, n)] == ["moved"]


def _each_ran_once(engine: Engine, n: int) -> None:
    """All ``n`` instances completed, each with exactly one attempt, ``moved``."""
    with engine.connect() as conn:
        statuses = conn.execute(text("SELECT status, count(*) FROM instances GROUP BY 1")).all()
        per = conn.execute(
            text("SELECT count(*), min(attempt), max(attempt) FROM attempts GROUP BY instance_id")
        ).all()
        outcomes = conn.execute(text("SELECT DISTINCT outcome FROM attempts")).scalars().all()
    assert statuses == [("completed", n)]
    assert len(per) == n and set(per) == {(1, 1, 1)}
    assert outcomes == ["moved"]


def _most(engine: Engine, **cfg) -> int:
    w = Worker(engine, WorkerConfig(worker_id="w0", **cfg))
    try:
        return w.cycles.most
    finally:
        w.cycles.close()
        w._db.shutdown()
        w.attempts.close()
        engine.dispose()


def test_one_cycle_in_flight_on_sqlite(tmp_path) -> None:
    """SQLite's cycles run on the loop (or wait for the write lock): one at a time."""
    assert _most(make_engine(f"sqlite:///{tmp_path / 'one.db'}")) == 1


@pytest.mark.postgres
def test_one_cycle_in_flight_with_a_pool_of_one_or_overlap_off(pg_url) -> None:
    """On PostgreSQL two cycles need two pooled connections: ``--pool-size 1`` keeps one
    in flight, as does ``WorkerConfig.overlap`` off."""
    assert _most(make_engine(pg_url)) == 2
    assert _most(make_engine(pg_url, pool=1)) == 1
    assert _most(make_engine(pg_url), overlap=False) == 1
