"""Pools: named slot counts shared by every daemon, enforced inside the claim.

A state with ``pool: NAME`` (``slots: N``, default 1) holds N of the pool's slots while
its attempt runs, exactly as long as the attempt's lease: the holders of a pool are the
instances whose row names the pool (``pool``, ``pool_slots``) with an attempt running
(``running_attempt``) under a lease not expired (``locked_until``). A crashed holder's
slots are free when its lease lapses.

The limit is kept inside the claim's own transaction (:func:`settle`, called by
``runner.store.leases.claim_batch`` after its ``UPDATE``): for each pool among the rows
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
lapsed, an attempt a command ended) wake as many waiters as slots freed, oldest due
first, telling the listening daemons (``notify_due``; on SQLite the commit itself rings
the daemons' commit bell).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Integer,
    bindparam,
    func,
    literal_column,
    null,
    select,
    update,
)

from runner.errors import UserError
from runner.store import versions
from runner.store.clock import db_now
from runner.store.db import Prepared
from runner.store.dialect import dialect_of
from runner.store.notify import notify_due
from runner.store.rows import CLAIMABLE
from runner.store.tables import instances, pools

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

i = instances.c


class PoolStatements:
    """The statements of a pooled claim and release, compiled once per engine
    (``db.Prepared``: a claim cycle runs them each time)."""

    def __init__(self, engine: Engine) -> None:
        d = dialect_of(engine)
        self.ids = d.ids_value
        at = bindparam("at", type_=Float())
        ins = d.insert(pools).values(
            name=bindparam("name"), declared=bindparam("declared", type_=Integer()), updated_at=at
        )
        #: lock the pool's row (made if missing), its size (params: name, declared, at)
        self.lock = Prepared(
            engine,
            ins.on_conflict_do_update(
                index_elements=[pools.c.name],
                # a write, so PostgreSQL locks the row (the declared size kept as it is)
                set_={"declared": func.coalesce(pools.c.declared, ins.excluded.declared)},
            ).returning(func.coalesce(pools.c.slots, pools.c.declared, 1)),
        )
        held = (i.pool == bindparam("name"), i.running_attempt.is_not(None), i.locked_until >= at)
        used = func.coalesce(func.sum(i.pool_slots), 0)
        #: slots in use but by the instances ``ids`` (params: name, at, ids)
        self.in_use = Prepared(engine, select(used).where(*held, ~d.ids_in(i.id)))
        #: the claims ``ids`` hold ``n`` slots of pool ``name`` (params: ids, name, n)
        self.hold = Prepared(
            engine,
            update(instances)
            .where(d.ids_in(i.id))
            .values(
                pool=bindparam("name"),
                pool_slots=bindparam("n", type_=Integer()),
                waiting_for=null(),
                wait_due=null(),
            ),
        )
        #: the claims ``ids`` undone: they wait for pool ``name``, not due (params: ids, name)
        self.wait = Prepared(
            engine,
            update(instances)
            .where(d.ids_in(i.id))
            .values(
                locked_by=null(),
                locked_until=null(),
                running_attempt=null(),
                attempts=i.attempts - 1,
                wait_due=i.due_at,
                due_at=null(),
                waiting_for=bindparam("name"),
                pool=null(),
                pool_slots=null(),
            ),
        )
        statuses = [literal_column(f"'{s}'") for s in CLAIMABLE]
        pick = (
            select(i.id)
            .where(i.waiting_for == bindparam("name"), i.due_at.is_(None), i.status.in_(statuses))
            .order_by(i.wait_due)
            .limit(bindparam("k", type_=Integer()))
        )
        if d.skip_locked:
            pick = pick.with_for_update(skip_locked=True)
        #: up to ``k`` waiters of pool ``name`` due again (params: name, k, at)
        self.wake = Prepared(
            engine,
            update(instances)
            .where(i.id.in_(pick.scalar_subquery()))
            .values(due_at=func.coalesce(i.wait_due, at), waiting_for=null(), wait_due=null()),
        )
        #: forget the seats of ``ids`` where no attempt runs any more (params: ids)
        self.clear = Prepared(
            engine,
            update(instances)
            .where(d.ids_in(i.id), i.running_attempt.is_(None))
            .values(pool=null(), pool_slots=null()),
        )


_statements: weakref.WeakKeyDictionary[Engine, PoolStatements] = weakref.WeakKeyDictionary()


def statements(conn: Connection) -> PoolStatements:
    """The :class:`PoolStatements` of ``conn``'s engine (compiled on first use)."""
    engine = conn.engine
    st = _statements.get(engine)
    if st is None:
        st = _statements[engine] = PoolStatements(engine)
    return st


@dataclass(frozen=True)
class Seat:
    """What a state asks of a pool: ``pool`` (its name), ``slots`` (held by one attempt),
    ``declared`` (the pool's size in the state's own flow file, ``None`` when another
    file declares it)."""

    pool: str
    slots: int
    declared: int | None


def seat_of(conn: Connection, version: str, state: str) -> Seat | None:
    """The pool ``state`` of flow ``version`` holds slots of, or ``None`` (no pool, or a
    version that no longer compiles)."""
    try:
        flow = versions.compiled(conn, version)
    except UserError:
        return None
    st = flow.states.get(state)
    if st is None or st.pool is None:
        return None
    return Seat(st.pool, st.slots, flow.pools.get(st.pool))


def declare(conn: Connection, flow: CompiledFlow, at: float) -> None:
    """Record the pools ``flow`` declares (``{name: slots}``) as their declared size (the
    last file recorded wins; ``flowrun check`` makes every file agree). In the caller's
    transaction; nothing when the flow declares none."""
    for name, size in flow.pools.items():
        ins = dialect_of(conn).insert(pools).values(name=name, declared=size, updated_at=at)
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=[pools.c.name],
                set_={"declared": ins.excluded.declared, "updated_at": at},
                where=pools.c.declared.is_distinct_from(ins.excluded.declared),
            )
        )


def lock(conn: Connection, name: str, declared: int | None, at: float) -> int:
    """Lock pool ``name``'s row until the transaction ends (creating it, with
    ``declared`` slots, if missing) and return its size: the operator's number, else the
    declared one, else 1."""
    rows = statements(conn).lock.fetch(conn, {"name": name, "declared": declared, "at": at})
    return int(rows[0][0])


def in_use(conn: Connection, name: str, at: float, besides: Sequence[int] = ()) -> int:
    """Slots of pool ``name`` held at ``at`` (epoch s) by running attempts under a valid
    lease, not counting the instances ``besides`` (ids)."""
    st = statements(conn)
    rows = st.in_use.fetch(conn, {"name": name, "at": at, "ids": st.ids(list(besides))})
    return int(rows[0][0])


def settle(conn: Connection, rows: Sequence, at: float) -> tuple[list, dict[int, Seat]]:
    """Keep the pool limits on ``rows`` (claim rows just claimed in this transaction,
    ``RETURNING`` ``rows.CLAIM_COLS``: ``id, flow, version, state, ..., pool, due_at``
    at indexes 0, 2, 3, 13, 14) at ``at`` (epoch s, the claim's time).

    Returns ``(kept, seats)``: the rows still claimed (in their order) and the seat each
    kept pooled claim holds, by instance id. The rows that did not fit are unclaimed in
    place and wait (see the module docstring); a row whose stored ``pool`` is stale (its
    state holds none now) has it cleared.
    """
    wants: dict[str, list[tuple[object, Seat]]] = {}
    stale: list[int] = []
    for r in rows:
        seat = seat_of(conn, r[2], r[3])
        if seat is None:
            if r[13] is not None:
                stale.append(r[0])
            continue
        wants.setdefault(seat.pool, []).append((r, seat))
    st = statements(conn)
    if stale:  # not running now (``clear``'s condition): write the NULLs directly
        conn.execute(update(instances).where(i.id.in_(stale)).values(pool=None, pool_slots=None))
    if not wants:
        return list(rows), {}
    ids = [r[0] for r in rows]
    seats: dict[int, Seat] = {}
    waiting: set[int] = set()
    for name in sorted(wants):  # one lock order for every daemon: no deadlock
        asks = wants[name]
        declared = next((s.declared for _, s in asks if s.declared is not None), None)
        free = lock(conn, name, declared, at) - in_use(conn, name, at, ids)
        late: list[int] = []
        for r, seat in sorted(asks, key=lambda a: a[0][14] or 0.0):
            if seat.slots <= free:
                free -= seat.slots
                seats[r[0]] = seat
            else:
                late.append(r[0])
        held: dict[int, list[int]] = {}
        for r, seat in asks:
            if r[0] in seats:
                held.setdefault(seat.slots, []).append(r[0])
        for n, held_ids in held.items():
            st.hold.executemany(conn, [{"ids": st.ids(held_ids), "name": name, "n": n}])
        if late:
            waiting.update(late)
            st.wait.executemany(conn, [{"ids": st.ids(late), "name": name}])
        elif free > 0:  # room left over: waiters the last release did not wake
            wake(conn, name, free, at)
    return [r for r in rows if r[0] not in waiting], seats


def wake(conn: Connection, name: str, count: int, at: float) -> int:
    """Make up to ``count`` waiters of pool ``name`` due again (oldest due first), at the
    due time they had (``at`` when unknown); returns how many. Waiters another transaction
    has locked are skipped (PostgreSQL), so two releases wake two different waiters."""
    if count <= 0:
        return 0
    woken = statements(conn).wake.executemany(conn, [{"name": name, "k": count, "at": at}])
    if woken:
        notify_due(conn)
    return max(woken, 0)


def release(conn: Connection, claims: Iterable, at: float | None = None) -> None:
    """After the commit of finished attempts (``rows.Claim`` objects; only those holding
    a pool's slots, ``claim.pool``, matter), in the same transaction: forget their seats
    (where no attempt runs on the row any more) and wake as many waiters as slots freed
    (due at ``at``, epoch s, when their old due time is unknown; default: now)."""
    freed: dict[str, int] = {}
    ids: list[int] = []
    for c in claims:
        if c.pool is not None:
            freed[c.pool] = freed.get(c.pool, 0) + c.pool_slots
            ids.append(c.id)
    if not ids:
        return
    at = db_now(conn) if at is None else at
    st = statements(conn)
    st.clear.executemany(conn, [{"ids": st.ids(ids)}])
    for name in sorted(freed):
        wake(conn, name, freed[name], at)


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
        free = (1 if size is None else size) - in_use(conn, name, at)
        woken += wake(conn, name, free, at)
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
    wake(conn, name, size - in_use(conn, name, at), at)
