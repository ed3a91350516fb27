"""``engine.claim_room.ClaimRoom``: how much a worker's next cycle claims, the standbys
it asks for, and no split claim while claims fill a pool; over a real
``RunningAttempts`` (no attempt runs: the claims are placed as a cycle would leave them).
Times are monotonic seconds passed explicitly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.engine.claim_room import ClaimRoom
from runner.engine.cycle import CycleRequest, CycleResult
from runner.engine.pacing import FILLED_FOR
from runner.engine.running import Running, RunningAttempts
from runner.handlers.attempt import Cancel
from runner.store.db import make_engine
from runner.store.rows import Claim


def _claim(iid: int, pool: str | None = "p", standby: str | None = None) -> Claim:
    return Claim(iid, "f", "v", "s", {}, 1, 1, 0, 0, [], 0, None, pool=pool, pool_slots=1,
                 standby_pool=standby)  # fmt: skip


def _run(claim: Claim) -> Running:
    claim.started_at = time.time()  # claimed just now: not due to be given back
    return Running(claim, None, Cancel(), [{}])  # type: ignore[arg-type]


@pytest.fixture
def attempts(tmp_path: Path) -> Iterator[RunningAttempts]:
    engine = make_engine(f"sqlite:///{tmp_path / 'room.db'}")

    async def no_db(fn, *args):
        raise AssertionError("no database call expected")

    a = RunningAttempts(engine, "w1", concurrency=4, kill_grace=1.0, in_db=no_db)
    try:
        yield a
    finally:
        a.close()
        engine.dispose()


def _ended(room: ClaimRoom, attempts: RunningAttempts, n: int, at: float) -> None:
    """``n`` attempts end within the claim-ahead window just before ``at``."""
    room.room(at - 0.1, free=0, claiming=0, stopping=False)  # the window opens
    attempts.ends += n


def test_the_room_is_the_free_slots_and_the_claims_ahead_less_those_held(attempts) -> None:
    room = ClaimRoom(attempts, prefetch=0)
    assert room.room(0.0, free=4, claiming=1, stopping=False) == (3, [])
    ahead = ClaimRoom(attempts, prefetch=8)
    _ended(ahead, attempts, 5, 0.0)  # five attempts ended in the window: five ahead
    assert ahead.room(0.0, free=4, claiming=0, stopping=False) == (9, [])
    attempts.waiting[1] = _run(_claim(1))
    attempts.standby[2] = _run(_claim(2, None, "p"))
    assert ahead.room(0.0, free=4, claiming=0, stopping=False) == (7, []), "two held already"
    attempts.waiting[1].claim.started_at -= 2 * attempts.start_within
    room_, back = ahead.room(0.0, free=4, claiming=0, stopping=False)
    assert room_ == 4 and [r.claim.id for r in back] == [1], "overdue: given back, none ahead"
    room_, back = ahead.room(0.0, free=4, claiming=0, stopping=True)
    assert room_ == 0 and [r.claim.id for r in back] == [2], "stopping: all given back"


def test_standbys_only_while_claiming_ahead_and_no_more_than_ahead(attempts) -> None:
    attempts.running[1] = _run(_claim(1))  # holding a seat of pool p
    attempts.running[2] = _run(_claim(2))
    attempts.standby[3] = _run(_claim(3, None, "p"))
    room = ClaimRoom(attempts, prefetch=0)
    room.room(0.0, free=2, claiming=0, stopping=False)
    request = CycleRequest("w1", 30.0, 2)
    room.ask_standbys(request)
    assert request.standby is None, "no claim ahead: no standby"
    ahead = ClaimRoom(attempts, prefetch=8)
    _ended(ahead, attempts, 3, 0.0)
    ahead.room(0.0, free=2, claiming=0, stopping=False)
    ahead.ask_standbys(request)
    assert request.standby == {"p": 1}, "two seats held, one standby already waits"
    assert request.standby_most == 2, "three claimed ahead, one of them a standby"


def test_a_refusal_stops_the_claims_ahead_and_a_filled_pool_the_split(attempts) -> None:
    room = ClaimRoom(attempts, prefetch=8)
    _ended(room, attempts, 3, 10.0)
    assert room.room(10.0, free=0, claiming=0, stopping=False) == (3, [])
    assert not room.filled(10.0)
    result = CycleResult(refused=2, filled=True)
    room.met(result, 10.0)
    assert room.room(10.1, free=0, claiming=0, stopping=False) == (0, []), "none ahead"
    assert room.filled(10.0 + FILLED_FOR / 2) and not room.filled(10.0 + FILLED_FOR)
