"""``runner.engine.pacing.plan``: when the worker starts its next cycle and how much it
claims, with plain numbers (monotonic seconds, counts)."""

from __future__ import annotations

from runner.engine.batching import HOLD_MAX
from runner.engine.cycle_runner import OVERLAP_MIN
from runner.engine.pacing import NOTHING, Step, plan


def test_nothing_to_commit_and_no_reason_to_claim_starts_nothing() -> None:
    assert plan(0.0, room=10) is NOTHING
    # room but no wish to claim; a wish but no room
    assert not plan(0.0, room=0, want_claim=True).start
    assert plan(0.0, room=0, want_claim=True, held_since=5.0).held_since is None


def test_a_wanted_claim_takes_the_whole_room() -> None:
    assert plan(0.0, room=10, want_claim=True) == Step(True, 10)
    assert plan(0.0, room=10, probe=True) == Step(True, 10, probe=True)


def test_finished_attempts_lost_attempts_or_claims_to_give_back_start_a_cycle() -> None:
    for given in (dict(finished=1), dict(recover=True), dict(release=True)):
        step = plan(0.0, 0, **given)
        assert step.start and step.claim == 0 and not step.split


def test_nearly_full_finished_attempts_wait_for_a_batch_then_go() -> None:
    # 64 slots, 60 running: fewer free than a quarter (16); one finished attempt waits
    step = plan(1.0, room=4, finished=1, running=60, concurrency=64)
    assert not step.start
    assert step.held_since == 1.0 and step.hold_until == 1.0 + HOLD_MAX
    assert step.quiet_above == 64 - 16
    # still waiting a moment later, from the same start
    later = plan(1.001, room=4, finished=2, running=60, concurrency=64, held_since=1.0)
    assert not later.start and later.held_since == 1.0
    # the wait is over: the cycle starts, nothing held any more
    over = plan(1.0 + HOLD_MAX, room=4, finished=3, running=60, concurrency=64, held_since=1.0)
    assert over.start and over.claim == 4 and over.held_since is None and over.quiet_above is None


def test_room_to_spare_stopping_recovery_or_give_backs_never_wait() -> None:
    assert plan(0.0, room=20, finished=1, running=40, concurrency=64).start
    assert plan(0.0, room=0, finished=1, running=0, concurrency=64).start  # stopping
    assert plan(0.0, room=4, finished=1, running=60, concurrency=64, recover=True).start
    assert plan(0.0, room=4, finished=1, running=60, concurrency=64, release=True).start


def test_a_second_cycle_starts_only_for_enough_work() -> None:
    busy = dict(flights=1, most=2, running=10, concurrency=256)
    few = plan(0.0, room=100, finished=OVERLAP_MIN - 1, held_since=3.0, **busy)
    assert not few.start and few.held_since == 3.0  # the cycle in flight is enough
    assert plan(0.0, room=0, finished=OVERLAP_MIN, **busy).start
    assert plan(0.0, room=0, release=True, **busy).start
    assert plan(0.0, room=OVERLAP_MIN, want_claim=True, **busy) == Step(True, OVERLAP_MIN)
    assert not plan(0.0, room=OVERLAP_MIN - 1, want_claim=True, **busy).start
    # in flight: never split, never held
    second = plan(
        0.0, room=200, finished=OVERLAP_MIN, flights=1, most=2, running=250, concurrency=256
    )
    assert second == Step(True, 200)


def test_a_cycle_alone_while_attempts_end_in_bulk_claims_half_the_room() -> None:
    bulk = plan(0.0, room=2 * OVERLAP_MIN + 1, finished=OVERLAP_MIN, most=2, concurrency=256)
    assert bulk == Step(True, OVERLAP_MIN, split=True)
    # one cycle at a time (SQLite), too little room or too few finished: the whole room
    assert plan(0.0, room=100, finished=OVERLAP_MIN, most=1, concurrency=256).claim == 100
    assert not plan(0.0, room=2 * OVERLAP_MIN - 1, finished=OVERLAP_MIN, most=2).split
    assert not plan(0.0, room=100, finished=OVERLAP_MIN - 1, most=2).split


def test_no_half_claim_while_claims_fill_a_pool() -> None:
    """A claim that filled a pool lately (``filled``): the whole room in one cycle. A
    pool's slots free only as their attempts' commits release them, so two half claims
    in flight would each find half of them."""
    args = {"room": 2 * OVERLAP_MIN + 1, "finished": OVERLAP_MIN, "most": 2, "concurrency": 256}
    assert plan(0.0, **args).split
    step = plan(0.0, **args, filled=True)
    assert step.start and not step.split and step.claim == 2 * OVERLAP_MIN + 1
