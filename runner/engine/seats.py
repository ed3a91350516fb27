"""Seats handed on: a pool's seat passed from an attempt that ended to a standby claim of
the same worker, with no database cycle in between.

A worker on PostgreSQL claims ahead of its free slots (``engine.ahead``). A claim held
ahead in a pool that is full would only be turned into a waiter, so the claim keeps a
*standby* instead (``store.pool_settle.settle``: at most as many as the worker claims
ahead and as it has attempts holding the pool's seats, :func:`budget`; when others wait
for the pool, the best of them are the standbys): claimed, with no seat. When one of the
worker's attempts in that pool ends, its seat goes at once to the oldest standby of that
pool asking as many slots (:func:`take_standby`), which starts in it. The slots in use
never change: until the ended attempt's commit, its row holds the seat (its attempt is
still named running, under its lease); that commit clears it and records the seat on the
standby's row in the same transaction (:func:`plan`, ``store.pools.hold_handed``), so
every daemon counts one holder throughout. A standby not started within the wait of any
claim held ahead is given back.

Two rules keep the count exact when things go wrong:

- the standby's own commit never comes before the commit that hands it the seat
  (:func:`split`: with two cycles in flight the later one could commit first);
- an ended attempt whose commit finds its instance taken away (a command, a lost lease)
  had no seat to hand on: the standby's is void (:func:`plan`), and a standby still
  running in it is cancelled (``CycleResult.unseated``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runner.store.rows import Claim

if TYPE_CHECKING:
    from runner.engine.running import Running
    from runner.handlers.attempt import AttemptResult

#: Outcomes whose seat is never handed on: a cancelled attempt may have been taken away,
#: a lost one's lease ran out
NOT_HANDED = frozenset(("cancelled", "lost"))


def may_hand_on(claim: Claim, result: AttemptResult) -> bool:
    """The seat of ``claim``, whose attempt ended with ``result``, may go to a standby:
    it holds one, has not handed it on, and its attempt ended by itself."""
    return claim.pool is not None and claim.seat_to is None and result.outcome not in NOT_HANDED


def budget(running: Iterable[Running], standby: Iterable[Running]) -> dict[str, int]:
    """How many more standbys a claim may make per pool (``{pool: count}``): the worker's
    running attempts holding the pool's seats and not yet handing them on, less the
    standbys it holds for that pool (a pool with a rate has none: each start counts)."""
    counts: dict[str, int] = {}
    for run in running:
        c = run.claim
        if c.pool is not None and c.seat_to is None and not c.pool_rated:
            counts[c.pool] = counts.get(c.pool, 0) + 1
    for run in standby:
        name = run.claim.standby_pool
        if name is not None and name in counts:
            counts[name] -= 1
    return {k: n for k, n in counts.items() if n > 0}


def take_standby(
    standby: dict[int, Running], ended: Claim, fresh: float, mono: float, lapsed: list[Running]
) -> Running | None:
    """The oldest standby in ``standby`` (by instance id, oldest first) that may start in
    the seat of ``ended`` (a claim whose attempt just ended holding a pool's seat): of its
    pool, asking as many slots. It leaves ``standby``, holding the seat in memory
    (``pool``, ``pool_slots``, ``seat_from``; ``ended.seat_to`` names it). Standbys met
    on the way that were claimed before ``fresh`` (epoch s) or whose self-fencing
    deadline is past ``mono`` (monotonic s) go to ``lapsed``; ``None``: none fits."""
    for iid, run in list(standby.items()):
        c = run.claim
        if c.standby_pool != ended.pool or c.pool_slots != ended.pool_slots:
            continue
        del standby[iid]
        if c.started_at < fresh or run.until <= mono:
            lapsed.append(run)
            continue
        c.pool, c.standby_pool, c.seat_from = ended.pool, None, ended
        ended.seat_to = c

        return run
    return None


def split(
    finished: list[tuple[Running, AttemptResult]],
) -> tuple[list[tuple[Running, AttemptResult]], list[tuple[Running, AttemptResult]]]:
    """``(batch, later)``: the finished attempts a cycle may commit now, and those that
    wait (in their order): an attempt started in a handed seat waits while the commit
    handing it the seat is neither done nor in the same batch."""
    batch: list[tuple[Running, AttemptResult]] = []
    later: list[tuple[Running, AttemptResult]] = []
    ids: set[int] = set()
    for pair in finished:
        c = pair[0].claim
        if c.seat_from is not None and c.seat_from.id not in ids:
            later.append(pair)
            continue
        batch.append(pair)
        ids.add(c.id)
    return batch, later


@dataclass
class HandOffs:
    """What a cycle does with the seats handed on among the claims it commits: ``hold``
    the standbys now recorded in their seats (still running), ``skip`` the claims whose
    slots are not freed by their release (handed on, or void), ``unseated`` the standbys
    still running in a void seat (to cancel), ``count`` the seats handed on (not void)."""

    hold: list[Claim] = field(default_factory=list)
    skip: set[int] = field(default_factory=set)
    unseated: list[Claim] = field(default_factory=list)
    count: int = 0  # seats handed on that are not void


def plan(ended: Iterable[Claim], lost: Collection[int]) -> HandOffs:
    """The :class:`HandOffs` of a cycle committing the claims ``ended`` (outcomes and
    cancelled attempts), of which ``lost`` (ids) were taken away. A seat handed from a
    lost claim, or from a void one, is void."""
    claims = {c.id: c for c in ended}
    pairs = [(c, c.seat_to) for c in claims.values() if c.seat_to is not None]
    if not pairs:
        return HandOffs()
    void: set[int] = set()
    grew = True
    while grew:  # a void seat handed on is void too
        grew = False
        for a, s in pairs:
            if (a.id in lost or a.id in void) and s.id not in void:
                void.add(s.id)
                grew = True
    out = HandOffs()
    for a, s in pairs:
        if a.id in lost or a.id in void:
            if s.id not in claims:
                out.unseated.append(s)
            continue
        out.skip.add(a.id)  # its seat is the standby's now
        out.count += 1
        if s.id not in claims:
            out.hold.append(s)
    out.skip |= void & claims.keys()
    return out


def settled(sent: Iterable[tuple[Running, AttemptResult]], unseated: Iterable[Claim]) -> None:
    """After the cycle that committed ``sent`` succeeded: the standbys it handed seats to
    may commit in any later cycle; those left ``unseated`` hold no seat any more (their
    release frees none)."""
    for run, _ in sent:
        s = run.claim.seat_to
        if s is not None:
            s.seat_from = None
    for s in unseated:
        s.pool, s.seat_from = None, None
