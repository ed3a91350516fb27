"""Pools: named slot counts shared by every daemon, enforced inside the claim.

A state with ``pool: NAME`` (``slots: N``, default 1) holds N of the pool's slots while
its attempt runs, exactly as long as the attempt's lease: the holders of a pool are the
instances whose row names the pool (``pool``, ``pool_slots``) with an attempt running
(``running_attempt``) under a lease not expired (``locked_until``). A crashed holder's
slots are free when its lease lapses.

The limit is kept inside the claim's own transaction (``runner.store.pool_settle.settle``,
called by ``runner.store.leases.claim_batch`` after its ``UPDATE``): for each pool among the rows
just claimed it locks the pool's row (an upsert: on PostgreSQL the row lock is held to
the end of the transaction, so the claims of one pool are serialised across daemons, and
each counts the holders in a snapshot taken after the previous one committed; on SQLite
the claim's write transaction excludes every other writer already), counts the slots in
use, keeps the claims that fit (highest priority, then earliest due) and turns the others
into waiters in the same transaction: unclaimed (their attempt count given back),
``due_at`` NULL (so no claim looks at them: no busy polling), ``waiting_for`` the pool,
``wait_due`` the due time they had.

A waiter becomes due again when slots free: :func:`release` (the commit of a pooled
attempt, in the commit's transaction), :func:`set_slots` (an operator), and
:func:`sweep` (with the worker's periodic look for lost attempts: a holder whose lease
lapsed, an attempt a command ended) wake as many waiters as slots freed, highest
priority first, then oldest due, telling the listening daemons (``notify_due``; on
SQLite the commit itself rings the daemons' commit bell). A release tells them only of
the woken waiters its own cycle's claim did not take (``runner.engine.cycle``).

A worker that claims ahead keeps claims ahead of a full pool as standbys instead: claimed
with no seat, started in the seat of one of its own attempts as that attempt ends;
:func:`hold_handed` records the seat on the standby's row in the ended attempt's commit
(``runner.engine.seats``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    func,
    or_,
    select,
    update,
)

from runner.errors import UserError
from runner.store import versions
from runner.store.clock import db_now
from runner.store.dialect import dialect_of
from runner.store.flow_limits import running
from runner.store.limit_names import is_limit
from runner.store.notify import notify_due
from runner.store.pool_statements import statements
from runner.store.tables import instances, pools

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.store.rows import Claim

i = instances.c


@dataclass(frozen=True)
class Seat:
    """What a state asks of the limits: ``pool`` (its pool's name, or ``None``),
    ``slots`` (held by one attempt), ``declared`` (the pool's size in the state's own
    flow file, ``None`` when another file declares it), ``pool_rate`` (the pool's rate in
    that file), ``rate`` (the state's own rate, ``"10/1m"``) and ``key`` (the row of the
    state's rate: ``<flow>.<state>``)."""

    pool: str | None
    slots: int
    declared: int | None
    pool_rate: str | None = None
    rate: str | None = None
    key: str = ""
    pool_rated: bool = False  # (a kept claim) its pool has a rate: no chained start in it
    limit: int | None = None  # its flow's max_running (``store.flow_limits``)
    limit_key: str | None = None  # and its key template
    holds: str | None = None  # (a kept claim) the flow limit it holds
    standby: bool = False  # (a kept claim) held with no seat: it waits for a seat handed on


_seats: dict[tuple[str, str], Seat | None] = {}
SEATS_MAX = 4096  # (version, state) pairs remembered; past it the memory starts afresh


def seat_of(conn: Connection, version: str, state: str) -> Seat | None:
    """What ``state`` of flow ``version`` asks of the limits, or ``None`` (no pool and no
    rate, or a version that no longer compiles). Remembered per ``(version, state)``: a
    version is its source's hash, so its seats never change (a claim asks per row)."""
    try:
        return _seats[version, state]
    except KeyError:
        pass
    try:
        flow = versions.compiled(conn, version)
    except UserError:
        return None  # not remembered: the version may be stored later
    global _changes
    if len(_seats) >= SEATS_MAX:
        _seats.clear()
        _changes += 1
    seat = _seats[version, state] = _seat(flow, state)
    if seat is not None and seat.pool is not None:
        _changes += 1  # one more state to write seats for
    return seat


_changes = 0  # pooled states added to ``seat_of``'s memory (or the memory cleared)
_seated: tuple[int, str] = (0, "")  # ``seated_json``'s text, as of ``_changes``


def seated_json() -> str | None:
    """The pooled states met so far (:func:`seat_of`'s memory) as JSON text
    ``{version: {state: [pool, slots]}}``, for the claim that records seats itself
    (``hot.claim_statement``'s ``seated``); ``None`` while none is known. Rebuilt only
    after a pooled state was added (a state added while it is built, on another database
    thread, makes the next call build it again)."""
    global _seated
    seen, text = _seated
    if seen != _changes:
        seen = _changes
        table: dict[str, dict[str, list[Any]]] = {}
        for (version, state), seat in list(_seats.items()):
            if seat is not None and seat.pool is not None:
                table.setdefault(version, {})[state] = [seat.pool, seat.slots]
        text = json.dumps(table) if table else ""
        _seated = (seen, text)
    return text or None


def _seat(flow: CompiledFlow, state: str) -> Seat | None:
    """``seat_of`` for a compiled ``flow``."""
    st = flow.states.get(state)
    cap = flow.max_running
    if st is None or (st.pool is None and st.rate is None and cap is None):
        return None
    seat = Seat(None, 0, None, None, st.rate, f"{flow.name}.{state}")
    if st.pool is not None:
        seat = Seat(
            st.pool,
            st.slots,
            flow.pools.get(st.pool),
            flow.pool_rates.get(st.pool),
            st.rate,
            f"{flow.name}.{state}",
        )
    return seat if cap is None else replace(seat, limit=cap[0], limit_key=cap[1])


def declare(conn: Connection, flow: CompiledFlow, at: float) -> None:
    """Record the pools ``flow`` declares (``{name: slots}``) as their declared size (the
    last file recorded wins; ``flowrun check`` makes every file agree). In the caller's
    transaction; nothing when the flow declares none."""
    rates = flow.pool_rates
    for name, size in flow.pools.items():
        ins = dialect_of(conn).insert(pools)
        ins = ins.values(name=name, declared=size, updated_at=at, rate=rates.get(name))
        x = ins.excluded
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=[pools.c.name],
                set_={"declared": x.declared, "rate": x.rate, "updated_at": at},
                where=or_(
                    pools.c.declared.is_distinct_from(x.declared),
                    pools.c.rate.is_distinct_from(x.rate),
                ),
            )
        )


def lock(
    conn: Connection, name: str, declared: int | None, at: float, rate: str | None = None
) -> tuple[int, str | None, list[float]]:
    """Lock row ``name`` of ``pools`` until the transaction ends (made if missing, with
    ``declared`` slots and ``rate``; a ``rate`` given replaces the stored one) and return
    ``(size, rate, starts)``: the operator's size, else the declared one, else 1; the rate
    (``"10/1m"`` or ``None``); its latest starts (epoch s)."""
    st = statements(conn)
    rows = st.lock.fetch(conn, {"name": name, "declared": declared, "at": at, "rate": rate})
    size, stored_rate, starts = rows[0]
    return int(size), stored_rate, list(st.load(starts) or [])


def lock_limit(conn: Connection, name: str, limit: int, at: float) -> int:
    """Lock flow limit ``name``'s row of ``pools`` (``runner.store.flow_limits``) until
    the transaction ends, its declared size brought to ``limit`` (the flow file's
    ``max_running``), and return its size in force (the operator's, else ``limit``)."""
    size, _, _ = lock(conn, name, limit, at)
    if size == limit:  # as declared (or set to it): nothing to bring up to date
        return size
    if statements(conn).redeclare.executemany(conn, [{"name": name, "declared": limit}]):
        size = size_of(conn, name) or limit
    return size


def in_use(conn: Connection, name: str, at: float, besides: Sequence[int] = ()) -> int:
    """Slots of pool ``name`` held at ``at`` (epoch s) by running attempts under a valid
    lease, not counting the instances ``besides`` (ids)."""
    st = statements(conn)
    rows = st.in_use.fetch(conn, {"name": name, "at": at, "ids": st.ids(list(besides))})
    return int(rows[0][0])


def in_use_waiting(
    conn: Connection, name: str, at: float, besides: Sequence[int]
) -> tuple[int, bool]:
    """:func:`in_use` and whether any instance waits for pool ``name``, in one read."""
    st = statements(conn)
    rows = st.in_use_waiting.fetch(conn, {"name": name, "at": at, "ids": st.ids(list(besides))})
    return int(rows[0][0]), bool(rows[0][1])


def wake(conn: Connection, name: str, count: int, at: float, tell: bool = True) -> list[int]:
    """Make up to ``count`` waiters of pool ``name`` due again (highest priority first,
    then oldest due), at the due time they had (``at`` when unknown); returns their ids.
    Waiters another transaction has locked are skipped (PostgreSQL), so two releases wake
    two different waiters. ``tell``: notify the listening daemons when the transaction
    commits (``notify_due``); without it the caller does, for the ones it leaves."""
    if count <= 0:
        return []
    rows = statements(conn).wake.fetch(conn, {"name": name, "k": count, "at": at})
    if rows and tell:
        notify_due(conn)
    return [r[0] for r in rows]


def release(
    conn: Connection,
    claims: Iterable[Claim],
    at: float | None = None,
    cleared: Collection[int] = (),
    skip: Collection[int] = (),
) -> list[int]:
    """After the commit of finished attempts (``rows.Claim`` objects; only those holding
    a pool's slots, ``claim.pool``, matter), in the same transaction: forget their seats
    (where no attempt runs on the row any more) and wake as many waiters as slots freed
    (due at ``at``, epoch s, when their old due time is unknown; default: now); a claim
    holding a flow limit (``claim.limit``) wakes one of its waiters. ``cleared``: ids of
    claims whose commit gave up the seat already (``rows.Outcome.seat_freed``): their
    waiters are woken, their rows not written again (a round trip less a cycle);
    ``skip``: ids of claims whose seat frees no slot (handed on to a standby, or void:
    ``runner.engine.seats``): their rows are cleared, nobody is woken for them.

    Returns the ids woken. Nobody is told of them here: the caller's transaction claims
    next and calls ``notify_due`` only for the woken rows it did not take itself (a
    release that wakes the waiter its own claim then takes, the common case of a busy
    pool, would otherwise send every daemon to claim for nothing)."""
    freed: dict[str, int] = {}
    ids: list[int] = []
    for c in claims:
        if c.pool is not None:
            if c.id not in skip:
                freed[c.pool] = freed.get(c.pool, 0) + c.pool_slots
            if c.id not in cleared:
                ids.append(c.id)
        if c.limit is not None:  # a flow limit: counted from the attempt running, no seat
            freed[c.limit] = freed.get(c.limit, 0) + 1
    st = statements(conn)
    if ids:
        st.clear.executemany(conn, [{"ids": st.ids(ids)}])
    if not freed:
        return []
    at = db_now(conn) if at is None else at
    woken: list[int] = []
    for name in sorted(freed):
        woken += wake(conn, name, freed[name], at, tell=False)
    return woken


def hold_handed(conn: Connection, standbys: Sequence[Claim]) -> None:
    """Record on their rows the seats handed to ``standbys`` (``rows.Claim`` objects with
    ``pool`` and ``pool_slots`` set: running in the seat of an attempt whose commit is in
    this transaction, ``runner.engine.seats``). No count, no lock: the slots in use do
    not change."""
    groups: dict[tuple[str, int], list[int]] = {}
    for c in standbys:
        assert c.pool is not None  # a standby in a handed seat
        groups.setdefault((c.pool, c.pool_slots), []).append(c.id)
    hold_seats(conn, groups)


def hold_seats(conn: Connection, groups: dict[tuple[str, int], list[int]]) -> None:
    """Record seats on claimed rows: ``{(pool, slots): [instance ids]}``, one statement
    per pair (the rows then count among the pool's holders)."""
    if groups:
        st = statements(conn)
        for (name, n), ids in groups.items():
            st.hold.executemany(conn, [{"ids": st.ids(ids), "name": name, "n": n}])


def size_of(conn: Connection, name: str) -> int | None:
    """Pool ``name``'s size now (operator's, else declared, else 1); ``None``: no such
    pool recorded."""
    row = conn.execute(
        select(func.coalesce(pools.c.slots, pools.c.declared, 1)).where(pools.c.name == name)
    ).first()
    return None if row is None else int(row[0])


def sweep(conn: Connection, at: float) -> int:
    """Wake the waiters of every pool that has slots free at ``at`` (a holder's lease
    lapsed, a command ended its attempt, the pool grew) and forget the seats of rows with
    no attempt running; returns how many waiters it woke. Cheap: two reads of partial
    indexes (the holders, the waiters) when nothing waits."""
    conn.execute(
        update(instances)
        .where(i.pool.is_not(None), i.running_attempt.is_(None))
        .values(pool=None, pool_slots=None)
    )
    names = conn.execute(
        select(i.waiting_for).where(i.waiting_for.is_not(None)).distinct()
    ).scalars()
    woken = 0
    for name in sorted(names):
        size = size_of(conn, name)
        held = running(conn, name, at) if is_limit(name) else in_use(conn, name, at)
        free = (1 if size is None else size) - held
        woken += len(wake(conn, name, free, at))
    return woken


def set_slots(conn: Connection, name: str, slots: int | None, at: float) -> None:
    """Set pool ``name``'s size at run time (``slots``; ``None``: back to the declared
    size) and wake the waiters the new size lets run.

    Raises:
        UserError: no pool of that name is recorded (no flow declaring it has run), or
            ``slots`` below 0.
    """
    if slots is not None and slots < 0:
        raise UserError(f"slots must be 0 or more, not {slots}", 2)
    res = conn.execute(update(pools).where(pools.c.name == name).values(slots=slots, updated_at=at))
    if not res.rowcount:
        known = ", ".join(sorted(conn.execute(select(pools.c.name)).scalars())) or "none"
        raise UserError(f"unknown pool {name!r} (known: {known})", 2)
    size = size_of(conn, name) or 0
    held = running(conn, name, at) if is_limit(name) else in_use(conn, name, at)
    wake(conn, name, size - held, at)
