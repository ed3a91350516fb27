"""Seats handed on (``runner.engine.seats``): standbys claimed with no seat, a finished
holder's seat passed to one of them, and the commit that records it; on a real SQLite
file and on the real PostgreSQL server, through the worker's own cycle
(``cycle.run_cycle``). The hand-off itself is made as ``RunningAttempts`` makes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.engine.cycle import CycleRequest, CycleResult, decide_finished, run_cycle
from runner.engine.running import Running, RunningAttempts
from runner.engine.seats import budget, plan, settled, split, take_standby
from runner.flowspec.compiled import CompiledFlow
from runner.handlers.attempt import AttemptResult, Cancel
from runner.ops.detail import instance_rows
from runner.ops.explain import explain
from runner.store.rows import Claim
from tests.support.fault import either_world, new_instance, row, sql
from tests.unit.engine.test_cycle import finished
from tests.unit.store.test_pools_store import FLOW, LEASE


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request, tmp_path: Path) -> Iterator[tuple[Engine, CompiledFlow]]:
    engine, flow = either_world(request, tmp_path, "wh", FLOW)
    try:
        yield engine, flow
    finally:
        engine.dispose()


def _cycle(
    engine: Engine, batch=(), *, free: int = 0, standby=None, most: int = 10, worker: str = "w1"
) -> CycleResult:
    request = CycleRequest(worker, LEASE, free)
    request.standby, request.standby_most = standby, most
    return run_cycle(engine, decide_finished(engine, list(batch), request, stopping=False))


def _in_use(engine: Engine) -> int:
    return sql(
        engine,
        "SELECT count(*) FROM instances WHERE pool = 'warehouse' AND running_attempt IS NOT NULL",
    )[0][0]


def _waiting(engine: Engine) -> list[int]:
    rows = sql(
        engine,
        "SELECT id FROM instances WHERE waiting_for = 'warehouse' AND due_at IS NULL ORDER BY id",
    )
    return [r[0] for r in rows]


def _split(claims: list[Claim]) -> tuple[list[Claim], list[Claim]]:
    seated = [c for c in claims if c.standby_pool is None]
    return seated, [c for c in claims if c.standby_pool is not None]


def _hand(holder: Claim, standbys: list[Claim]) -> Claim:
    """The hand-off as ``RunningAttempts`` makes it when ``holder``'s attempt ends."""
    queue = {c.id: Running(c, None, Cancel(), [c.data]) for c in standbys}  # type: ignore[arg-type]
    run = take_standby(queue, holder, 0.0, 0.0, [])
    assert run is not None
    return run.claim


def test_a_claim_holds_standbys_with_no_seat_up_to_the_seats_it_gives(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    seated, standbys = _split(_cycle(engine, free=10, standby={}).claims)
    assert [c.id for c in seated] == ids[:2] and all(c.pool == "warehouse" for c in seated)
    assert [c.id for c in standbys] == ids[2:4], "one standby per seat this claim gave"
    assert all(c.pool is None and c.standby_pool == "warehouse" for c in standbys)
    assert _in_use(engine) == 2, "a standby holds no seat"
    r = row(engine, ids[2])
    assert (r["locked_by"], r["pool"]) == ("w1", None), "claimed, with no seat"
    assert _waiting(engine) == ids[4:]
    said = {iid: _forecast(engine, flow, iid) for iid in (ids[0], ids[2])}
    assert said[ids[0]].startswith("attempt 1 is running on w1")
    assert said[ids[2]].startswith("claimed by w1 as a standby of pool warehouse")


def _forecast(engine: Engine, flow: CompiledFlow, iid: int) -> str:
    rows = instance_rows(engine, iid)
    assert rows is not None
    return explain(rows, lambda v: flow, time.time()).forecast[0].text


def test_without_a_budget_a_full_pool_makes_waiters_only(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    seated, standbys = _split(_cycle(engine, free=10).claims)
    assert [c.id for c in seated] == ids[:2] and standbys == []
    assert _waiting(engine) == ids[2:]


def test_standbys_no_more_than_the_worker_claims_ahead(world) -> None:
    """A standby waits for one of its worker's attempts to end: no more of them than
    the worker claims ahead (none while its attempts end slowly)."""
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    seated, standbys = _split(_cycle(engine, free=10, standby={}, most=1).claims)
    assert [c.id for c in seated] == ids[:2] and [c.id for c in standbys] == ids[2:3]
    assert _waiting(engine) == ids[3:]
    assert _cycle(engine, free=10, standby={"warehouse": 2}, most=0).claims == []
    assert _waiting(engine) == ids[3:]


def test_the_best_waiters_become_standbys_before_newer_work(world) -> None:
    """Others wait for the pool: the claim's own rows wait too, and the oldest waiters
    are the standbys, so nobody is passed over."""
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    assert len(_cycle(engine, free=2, worker="w2").claims) == 2
    _cycle(engine, free=3, worker="w3")  # three more claims: all refused, waiting
    assert _waiting(engine) == ids[2:]
    later = [new_instance(engine, flow) for _ in range(2)]
    seated, standbys = _split(_cycle(engine, free=4, standby={"warehouse": 2}).claims)
    assert seated == [] and [c.id for c in standbys] == ids[2:4]
    assert _waiting(engine) == [ids[4], *later]
    assert _in_use(engine) == 2


def test_a_seat_handed_on_is_the_standbys_after_the_givers_commit(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    (a, _b), standbys = _split(_cycle(engine, free=10, standby={}).claims)
    s = _hand(a, standbys)
    assert (s.id, s.pool, s.seat_from, a.seat_to) == (ids[2], "warehouse", a, s)
    got = _cycle(engine, [finished(a, "moved", "done")])
    assert got.unseated == [] and got.lost == [] and got.handed == 1
    assert row(engine, a.id)["pool"] is None
    assert (row(engine, s.id)["pool"], row(engine, s.id)["pool_slots"]) == ("warehouse", 1)
    assert _in_use(engine) == 2, "the slots in use never changed"
    assert _waiting(engine) == ids[4:], "no slot freed: nobody woken"


def test_a_seat_from_an_attempt_taken_away_is_void(world) -> None:
    engine, flow = world
    [new_instance(engine, flow) for _ in range(5)]
    (a, _b), standbys = _split(_cycle(engine, free=10, standby={}).claims)
    s = _hand(a, standbys)
    sql(engine, "UPDATE instances SET fence = fence + 1 WHERE id = :i", i=a.id)  # taken
    got = _cycle(engine, [finished(a, "moved", "done")])
    assert got.lost == [a.id] and got.unseated == [s] and got.handed == 0
    assert row(engine, s.id)["pool"] is None, "no seat recorded for it"


def test_a_standby_ending_in_its_givers_batch_frees_one_slot(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    (a, _b), standbys = _split(_cycle(engine, free=10, standby={}).claims)
    s = _hand(a, standbys)
    got = _cycle(engine, [finished(a, "moved", "done"), finished(s, "moved", "done")])
    assert got.unseated == [] and got.committed == 2
    assert row(engine, s.id)["pool"] is None and row(engine, s.id)["status"] == "completed"
    assert _in_use(engine) == 1
    assert _waiting(engine) == [], "the one slot freed woke the waiter"
    assert row(engine, ids[4])["due_at"] is not None


def _claim(iid: int, pool: str | None = "p", standby: str | None = None) -> Claim:
    return Claim(iid, "f", "v", "s", {}, 1, 1, 0, 0, [], 0, None, pool=pool, pool_slots=1,
                 standby_pool=standby)  # fmt: skip


def test_a_standby_commits_only_with_or_after_the_commit_handing_it_the_seat() -> None:
    a, s = _claim(1), _claim(2, None, "p")
    queue = {s.id: Running(s, None, Cancel(), [{}])}  # type: ignore[arg-type]
    assert take_standby(queue, a, 0.0, 0.0, []) is not None
    done = AttemptResult("moved", {}, to_state="done")
    pa, ps = (Running(a, None, Cancel(), [{}]), done), (Running(s, None, Cancel(), [{}]), done)  # type: ignore[arg-type]
    assert split([ps]) == ([], [ps]), "its giver's commit is neither done nor in the batch"
    assert split([pa, ps]) == ([pa, ps], [])
    settled([pa], [])
    assert split([ps]) == ([ps], [])


def test_a_void_seat_handed_on_is_void_too() -> None:
    a, s, t = _claim(1), _claim(2), _claim(3)
    a.seat_to, s.seat_from, s.seat_to, t.seat_from = s, a, t, s
    got = plan([a, s], lost={1})
    assert got.hold == [] and got.unseated == [t] and got.skip == {2} and got.count == 0
    got = plan([a, s], lost=())
    assert got.hold == [t] and got.skip == {1, 2} and got.unseated == [] and got.count == 2


def test_the_budget_counts_holders_not_yet_handing_on_less_the_standbys() -> None:
    def run(c: Claim) -> Running:
        return Running(c, None, Cancel(), [{}])  # type: ignore[arg-type]

    handing = _claim(3)
    handing.seat_to = _claim(9)
    rated = _claim(4)
    rated.pool_rated = True
    running = [run(_claim(1)), run(_claim(2)), run(handing), run(rated), run(_claim(5, None))]
    assert budget(running, [run(_claim(6, None, "p"))]) == {"p": 1}
    assert budget(running, [run(_claim(6, None, "p")), run(_claim(7, None, "p"))]) == {}


def test_an_ending_attempt_starts_a_standby_in_its_seat_at_once(world) -> None:
    engine, flow = world
    [new_instance(engine, flow) for _ in range(4)]
    (a, b), standbys = _split(_cycle(engine, free=10, standby={}).claims)

    async def scenario() -> tuple[set[int], set[int], set[int]]:
        attempts = RunningAttempts(engine, "w1", concurrency=2, kill_grace=1.0, in_db=_no_db)
        try:
            attempts.start(standbys)
            assert set(attempts.standby) == {c.id for c in standbys}
            for c in (a, b):
                attempts.running[c.id] = Running(c, None, Cancel(), [c.data])  # type: ignore[arg-type]
            attempts._finished(attempts.running[a.id], AttemptResult("cancelled", {}))
            untouched = set(attempts.standby)  # a cancelled attempt hands nothing on
            attempts._finished(attempts.running[b.id], AttemptResult("moved", {}, "done"))
            now_running = set(attempts.running)
            for run in attempts.running.values():
                run.task.cancel()
            await asyncio.sleep(0)
            return untouched, now_running, set(attempts.standby)
        finally:
            attempts.close()

    untouched, now_running, left = asyncio.run(scenario())
    first, second = (c.id for c in standbys)
    assert untouched == {first, second}
    assert now_running == {first} and left == {second}, "the oldest standby, in b's seat"
    assert b.seat_to is not None and b.seat_to.id == first


async def _no_db(fn, *args):
    raise AssertionError("no database call expected")
