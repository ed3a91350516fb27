"""A claim's limits kept inside its own transaction: :func:`settle` keeps the pools'
slots and rates and the flows' ``max_running`` on the rows a claim just took, and turns
the claims that do not fit into waiters (``runner.store.pools`` says how a waiter is woken
again) or, for a worker that claims ahead, into standbys (``runner.engine.seats``).
Called by ``runner.store.leases.claim_batch`` after its ``UPDATE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, update

from runner.flowspec.spec_types import parse_rate
from runner.store.flow_limits import running
from runner.store.limit_names import is_limit, limit_name
from runner.store.pool_statements import statements
from runner.store.pools import (
    Seat,
    hold_seats,
    in_use_waiting,
    lock,
    lock_limit,
    seat_of,
    wake,
)
from runner.store.rows import LIMIT_KEY_AT, POOL_SLOTS_AT
from runner.store.tables import instances

i = instances.c


@dataclass
class _Limit:
    """One locked row of ``pools`` while a claim is settled: slots ``free`` (``None``: no
    slot limit), its rate as ``(count, seconds)`` and the ``starts`` within the window."""

    free: int | None
    rate: tuple[int, float] | None
    starts: list[float]
    text: str = ""
    used: bool = False  # a start was added
    waiters: bool = True  # some instance may wait for it (``False``: read none waiting)

    def room(self) -> bool:
        """Another start fits the rate (or there is none)."""
        return self.rate is None or len(self.starts) < self.rate[0]

    def next_start(self, k: int) -> float:
        """When the ``k``-th (0-based) start refused now may start: the window moved."""
        assert self.rate is not None
        n, window = self.rate
        ordered = sorted(self.starts)[-n:]
        return ordered[k % len(ordered)] + window * (1 + k // len(ordered))


@dataclass(frozen=True)
class StandbyAsk:
    """What a claim may hold as standbys (``runner.engine.seats``): ``budget``
    (``{pool: count}``: how many of worker ``worker``'s running attempts hold each pool's
    seats and may hand them on, besides the claims this one gives a seat), the claim's
    lease end ``until`` (epoch s), the
    worker's ``labels`` (``runner.labels.canonical`` text) and the ``room`` the claim has
    (claims it may return: the due rows it took, and waiters as standbys up to it) and
    the ``most`` standbys it may make (as many as its worker claims ahead: a standby
    waits for one of its attempts to end, ``runner.engine.ahead``)."""

    budget: Mapping[str, int]
    worker: str
    until: float
    labels: str
    room: int = 0  # the most claims the claim may return
    most: int = 0  # the most standbys it may make


def settle(
    conn: Connection,
    rows: Sequence[Any],
    at: float,
    standby: StandbyAsk | None = None,
    filled: list[str] | None = None,
) -> tuple[list[Any], dict[int, Seat]]:
    """Keep the pool limits and rates on ``rows`` (claim rows just claimed in this
    transaction, ``RETURNING`` ``rows.CLAIM_COLS``: ``id, flow, version, state, data,
    ..., pool, due_at, priority`` at indexes 0, 1, 2, 3, 4, 13, 14, 15, ``limit_key`` at
    ``rows.LIMIT_KEY_AT``) at ``at`` (epoch s, the claim's time). The claims that fit are
    kept highest priority first, then earliest due. A flow's ``max_running`` is kept here
    too, as a pool named by ``runner.store.flow_limits`` whose holders are counted from
    the attempts running.

    ``standby`` (:class:`StandbyAsk`, ``runner.engine.seats``): a row refused for the
    slots of a pool of its budget (a pool with no rate; the row's state with no rate
    and its flow with no ``max_running``) stays claimed with no seat as a *standby*
    (``Seat.standby``), up to the budget: its worker starts it only in the seat of one
    of its own attempts of that pool as that attempt ends, so the slots in use never
    change for it. When others wait for the pool, the row waits too and the best
    waiters (highest priority, then earliest due; the row among them) are claimed as
    the standbys instead, so nobody is passed over.

    ``filled``: when given, the names of the pools and flow limits with no slot left
    once the claim is settled are appended to it (the worker then claims in one cycle
    at a time, ``runner.engine.pacing``).

    Returns ``(kept, seats)``: the rows still claimed (in their order) and the seat of
    each kept claim with a pool or a rate, by instance id (``pool_rated`` set). A row
    refused for its pool's slots is unclaimed in place and waits (see the module
    docstring); one refused for a rate is unclaimed and due when the window lets it
    start (``waiting_for`` says which rate). A row whose stored ``pool`` is stale (its
    state holds none now) has it cleared.
    """
    asks: list[tuple[Any, Seat]] = []
    stale: list[int] = []
    spare = dict(standby.budget) if standby is not None else {}
    left = standby.most if standby is not None else 0  # standbys it may still make
    swaps: dict[str, int] = {}  # pool: waiters to claim as standbys
    for r in rows:
        seat = seat_of(conn, r[2], r[3])
        if seat is None or seat.pool is None:
            if r[13] is not None:
                stale.append(r[0])
        if seat is not None:
            asks.append((r, seat))
    st = statements(conn)
    if stale:  # not running now (``clear``'s condition): write the NULLs directly
        conn.execute(update(instances).where(i.id.in_(stale)).values(pool=None, pool_slots=None))
    if not asks:
        return list(rows), {}
    bare: list[int] = []  # standbys whose row names a pool
    ids = [r[0] for r in rows]
    wanted: dict[str, tuple[int | None, str | None, bool]] = {}  # name: declared, rate, slots?
    named: dict[int, str] = {}  # id: the flow limit its claim holds
    unkeyed: dict[str, list[int]] = {}  # made before its flow had a limit: no key stored
    for r, seat in asks:
        if seat.limit is not None:
            name = r[LIMIT_KEY_AT]
            if name is None:
                data = st.load(r[4]) if isinstance(r[4], (str, bytes)) else r[4]
                name = limit_name(r[1], seat.limit_key, data or {})
                unkeyed.setdefault(name, []).append(r[0])
            named[r[0]] = name
            wanted[name] = (seat.limit, None, True)
        if seat.pool is not None:
            old = wanted.get(seat.pool, (None, None, True))
            wanted[seat.pool] = (old[0] or seat.declared, old[1] or seat.pool_rate, True)
        if seat.rate is not None:
            wanted[seat.key] = (None, seat.rate, False)
    limits: dict[str, _Limit] = {}
    for name in sorted(wanted):  # one lock order for every daemon: no deadlock
        declared, rate, slotted = wanted[name]
        if is_limit(name):
            assert declared is not None  # a limit's size
            size = lock_limit(conn, name, declared, at)
            limits[name] = _Limit(size - running(conn, name, at, ids), None, [])
            continue
        size, rate_text, starts = lock(conn, name, declared, at, rate)
        free, waiters = None, True
        if slotted:
            used, waiters = in_use_waiting(conn, name, at, ids)
            free = size - used
        parsed = parse_rate(rate_text) if rate_text else None
        window = parsed[1] if parsed else 0.0
        kept = [t for t in starts or [] if t > at - window]
        limits[name] = _Limit(free, parsed, kept, rate_text or "", waiters=waiters)
    seats: dict[int, Seat] = {}
    full: dict[str, list[int]] = {}
    delayed: list[dict[str, Any]] = []
    refused: dict[str, int] = {}
    for r, seat in sorted(asks, key=lambda a: (-a[0][15], a[0][14] or 0.0)):
        pool = limits.get(seat.pool) if seat.pool is not None else None
        rated = [limits[k] for k in (seat.pool, seat.key if seat.rate else None) if k in limits]
        capped = named.get(r[0])
        if pool is not None and pool.free is not None and seat.slots > pool.free:
            assert seat.pool is not None  # pool is its limit
            if (
                spare.get(seat.pool, 0) > 0
                and left > 0
                and pool.rate is None
                and seat.rate is None
                and capped is None
            ):  # its worker may hand it a seat of its own as one ends: a standby
                spare[seat.pool] -= 1
                left -= 1
                if pool.waiters or seat.pool in full:  # the best waiters go first
                    swaps[seat.pool] = swaps.get(seat.pool, 0) + 1
                else:
                    seats[r[0]] = replace(seat, standby=True)
                    if r[13] is not None:
                        bare.append(r[0])
                    continue
            full.setdefault(seat.pool, []).append(r[0])
            continue
        cap = limits[capped] if capped is not None else None
        if capped is not None and cap is not None and (cap.free or 0) < 1:
            full.setdefault(capped, []).append(r[0])
            continue
        over = next(
            (k for k in (seat.pool, seat.key) if k in limits and not limits[k].room()), None
        )
        if over is not None:
            lim = limits[over]
            k = refused[over] = refused.get(over, -1) + 1
            what = f"pool {over}" if over == seat.pool else f"state {seat.key}"
            delayed.append(
                {"i": r[0], "due": lim.next_start(k), "why": f"rate {lim.text} ({what})"}
            )
            continue
        if pool is not None and pool.free is not None:
            pool.free -= seat.slots
            if standby is not None and seat.pool is not None:  # runs here: a seat to hand on
                spare[seat.pool] = spare.get(seat.pool, 0) + 1
        if cap is not None and cap.free is not None:
            cap.free -= 1
        for lim in rated:
            if lim.rate is not None:
                lim.starts.append(at)
                lim.used = True
        rated_pool = pool is not None and pool.rate is not None
        if rated_pool or capped is not None:  # (a remembered seat has neither set)
            seat = replace(seat, pool_rated=rated_pool, holds=capped)
        seats[r[0]] = seat
    if filled is not None:
        filled += [k for k, lim in limits.items() if lim.free is not None and lim.free <= 0]
    held: dict[tuple[str, int], list[int]] = {}
    plain: list[int] = []
    for r, seat in asks:
        if r[0] in seats and not seats[r[0]].standby:
            if seat.pool is not None:
                if not _recorded(r, seat, limits):  # (else the claim wrote it already)
                    held.setdefault((seat.pool, seat.slots), []).append(r[0])
            elif seat.rate is not None:  # (a flow limit alone leaves no mark to undo)
                plain.append(r[0])
    hold_seats(conn, held)
    if plain:  # a rate's mark, if any, is over
        st.unmark.executemany(conn, [{"ids": st.ids(plain)}])
    if bare:  # standbys whose row still names a pool: they hold no seat
        conn.execute(update(instances).where(i.id.in_(bare)).values(pool=None, pool_slots=None))
    for name, keyless in unkeyed.items():
        st.keyed.executemany(conn, [{"ids": st.ids(keyless), "name": name}])
    for name, late in full.items():
        st.wait.executemany(conn, [{"ids": st.ids(late), "name": name}])
    if delayed:
        st.delay.executemany(conn, delayed)
    for name, lim in limits.items():
        if lim.used:
            st.save_starts.executemany(conn, [{"name": name, "starts": st.json(lim.starts)}])
        if lim.free is not None and lim.free > 0 and lim.waiters and name not in full:
            wake(conn, name, lim.free, at)  # room left over: waiters not woken yet
    gone = {d["i"] for d in delayed} | {x for late in full.values() for x in late}
    kept = [r for r in rows if r[0] not in gone]
    if standby is not None:
        room = min(standby.room - len(kept) - sum(swaps.values()), left)
        for name in sorted(spare):  # room left: the best waiters as standbys too
            pooled = limits.get(name)
            if room <= 0 or pooled is None or pooled.rate is not None or (pooled.free or 0) > 0:
                continue  # (a pool with slots free wakes its waiters: they are due)
            if spare[name] > 0 and (pooled.waiters or name in full):
                extra = min(spare[name], room)
                swaps[name] = swaps.get(name, 0) + extra
                room -= extra
    if swaps:
        assert standby is not None  # (swaps come from its budget)
        kept += waiters_as_standbys(conn, swaps, at, standby, seats)
    return kept, seats


def _recorded(r: Any, seat: Seat, limits: Mapping[str, _Limit]) -> bool:
    """The claim statement itself recorded ``seat`` on claim row ``r``
    (``hot.claim_statement``'s ``seated``), and no rate asks the row's ``waiting_for``
    cleared: its seat needs no second write."""
    if r[13] != seat.pool or r[POOL_SLOTS_AT] != seat.slots or seat.rate is not None:
        return False
    pool = limits.get(r[13])
    return pool is not None and pool.rate is None


def standbys(
    conn: Connection, ask: StandbyAsk, room: int, at: float, seats: dict[int, Seat]
) -> list[Any]:
    """A claim that took no pooled row: up to ``room`` of the best waiters of the pools
    of ``ask.budget`` as standbys (:func:`waiters_as_standbys`). No pool row is locked:
    a standby holds no seat."""
    swaps: dict[str, int] = {}
    room = min(room, ask.most)
    for name in sorted(ask.budget):
        k = min(ask.budget[name], room)
        if k > 0:
            swaps[name] = k
            room -= k
    return waiters_as_standbys(conn, swaps, at, ask, seats) if swaps else []


def waiters_as_standbys(
    conn: Connection, swaps: dict[str, int], at: float, ask: StandbyAsk, seats: dict[int, Seat]
) -> list[Any]:
    """Claim the best ``swaps[pool]`` waiters of each pool as standbys of ``ask.worker``
    (``PoolStatements.take_waiters``); returns their claim rows and adds their seats to
    ``seats``. A waiter that may not be a standby (its state has a rate of its own) is
    made to wait again."""
    st = statements(conn)
    out: list[Any] = []
    for name in sorted(swaps):
        params = {"name": name, "k": swaps[name], "at": at, "w": ask.worker}
        params.update(until=ask.until, labels=ask.labels)
        again: list[int] = []
        for r in st.take_waiters.fetch(conn, params):
            seat = seat_of(conn, r[2], r[3])
            if seat is None or seat.pool != name or seat.rate is not None:
                again.append(r[0])
                continue
            seats[r[0]] = replace(seat, standby=True)
            out.append(r)
        if again:
            st.wait.executemany(conn, [{"ids": st.ids(again), "name": name}])
    return out
