"""The statements of a pooled claim and release (``runner.store.pools``), compiled once
per engine (``prepared.Prepared``: a claim cycle runs them each time)."""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Float,
    Integer,
    Select,
    bindparam,
    func,
    literal_column,
    null,
    select,
    update,
)

from runner.store.dialect import Dialect, dialect_of
from runner.store.prepared import Prepared
from runner.store.rows import CLAIM_COLS, CLAIMABLE
from runner.store.tables import JSONType, instances, pools

i = instances.c


class PoolStatements:
    """The statements of a pooled claim and release, compiled once per engine
    (``prepared.Prepared``: a claim cycle runs them each time)."""

    def __init__(self, engine: Engine) -> None:
        d = dialect_of(engine)
        self.ids = d.ids_value
        at = bindparam("at", type_=Float())
        self.json = d.json_adapter()
        self.load = d.json_loader()
        ins = d.insert(pools).values(
            name=bindparam("name"),
            declared=bindparam("declared", type_=Integer()),
            updated_at=at,
            rate=bindparam("rate"),
        )
        #: lock the row (made if missing): size, rate, starts (params: name, declared,
        #: at, rate)
        self.lock = Prepared(
            engine,
            ins.on_conflict_do_update(
                index_elements=[pools.c.name],
                # a write, so PostgreSQL locks the row (the declared size kept as it is)
                set_={
                    "declared": func.coalesce(pools.c.declared, ins.excluded.declared),
                    "rate": func.coalesce(ins.excluded.rate, pools.c.rate),
                },
            ).returning(
                func.coalesce(pools.c.slots, pools.c.declared, 1), pools.c.rate, pools.c.starts
            ),
        )
        #: a rate's latest starts (params: name, starts)
        self.save_starts = Prepared(
            engine,
            update(pools)
            .where(pools.c.name == bindparam("name"))
            .values(starts=bindparam("starts", type_=JSONType)),
        )
        #: a claim refused by a rate: unclaimed, due when the window moves (params: i,
        #: due, why)
        self.delay = Prepared(
            engine,
            update(instances)
            .where(i.id == bindparam("i"))
            .values(
                locked_by=null(),
                locked_until=null(),
                running_attempt=null(),
                attempts=i.attempts - 1,
                due_at=bindparam("due", type_=Float()),
                waiting_for=bindparam("why"),
                pool=null(),
                pool_slots=null(),
            ),
        )
        #: the claims ``ids`` wait for nothing (params: ids)
        self.unmark = Prepared(
            engine, update(instances).where(d.ids_in(i.id)).values(waiting_for=null())
        )
        held = (i.pool == bindparam("name"), i.running_attempt.is_not(None), i.locked_until >= at)
        used = func.coalesce(func.sum(i.pool_slots), 0)
        held_sum = select(used).where(*held, ~d.ids_in(i.id))
        #: slots in use but by the instances ``ids`` (params: name, at, ids)
        self.in_use = Prepared(engine, held_sum)
        waiting = (
            select(i.id)
            .where(i.waiting_for == bindparam("name"), i.due_at.is_(None))
            .limit(1)
            .exists()
        )
        #: ``in_use`` and whether any instance waits for ``name`` (params: name, at, ids;
        #: a read of ``ix_instances_waiting`` lets a claim skip ``wake`` with none waiting)
        self.in_use_waiting = Prepared(
            engine,
            select(held_sum.scalar_subquery(), waiting.label("w")),
        )
        holding = (  # a range of ix_instances_limit: the locked rows of the limit
            i.limit_key == bindparam("name"),
            i.locked_by > "",
            i.running_attempt.is_not(None),
        )
        #: attempts holding flow limit ``name`` but the instances ``ids`` (params: name,
        #: at, ids; ``runner.store.flow_limits``)
        self.limit_in_use = Prepared(
            engine, select(func.count()).where(*holding, i.locked_until >= at, ~d.ids_in(i.id))
        )
        #: a flow limit's declared size, when the flow file changed it (params: name,
        #: declared)
        self.redeclare = Prepared(
            engine,
            update(pools)
            .where(pools.c.name == bindparam("name"))
            .where(pools.c.declared.is_distinct_from(bindparam("declared", type_=Integer())))
            .values(declared=bindparam("declared", type_=Integer())),
        )
        #: the claims ``ids`` of an instance made before its flow had a limit: their key
        #: (params: ids, name)
        self.keyed = Prepared(
            engine, update(instances).where(d.ids_in(i.id)).values(limit_key=bindparam("name"))
        )
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
        pick = _best_waiters(d)
        #: up to ``k`` waiters of pool ``name`` due again; returns their ids (params:
        #: name, k, at)
        self.wake = Prepared(
            engine,
            update(instances)
            .where(i.id.in_(pick.scalar_subquery()))
            .values(due_at=func.coalesce(i.wait_due, at), waiting_for=null(), wait_due=null())
            .returning(i.id),
        )
        best = _best_waiters(d, i.limit_key.is_(None), d.covered(i.runs_on))
        #: claim up to ``k`` of the best waiters of pool ``name`` (its worker's labels
        #: covering them) as standbys of worker ``w``: due again at the due time they
        #: had, claimed as ``hot.claim_statement`` claims (params: name, k, at, w,
        #: until, labels); returns ``rows.CLAIM_COLS``
        self.take_waiters = Prepared(
            engine,
            update(instances)
            .where(i.id.in_(best.scalar_subquery()))
            .values(
                due_at=func.coalesce(i.wait_due, at),
                waiting_for=null(),
                wait_due=null(),
                locked_by=bindparam("w"),
                locked_until=bindparam("until", type_=Float()),
                fence=i.fence + 1,
                attempts=i.attempts + 1,
                running_attempt=i.attempts + 1,
                state_attempted=at,
                updated_at=at,
            )
            .returning(*CLAIM_COLS),
        )
        #: forget the seats of ``ids`` where no attempt runs any more (params: ids; a
        #: row its commit released already holds none and is not written again)
        self.clear = Prepared(
            engine,
            update(instances)
            .where(d.ids_in(i.id), i.running_attempt.is_(None), i.pool.is_not(None))
            .values(pool=null(), pool_slots=null()),
        )


def _best_waiters(d: Dialect, *also: ColumnElement[bool]) -> Select[Any]:
    """The ids of up to ``k`` waiters of pool ``name`` (params), highest priority first,
    then oldest due (``FOR UPDATE SKIP LOCKED`` where the database has it), meeting
    ``also`` too.

    ``status || ''``: no index serves the status test, so the waiters are read in
    ``ix_instances_waiting`` order (with the status indexed, PostgreSQL planned a scan of
    every runnable row of ``ix_instances_claim`` for ``due_at IS NULL``: 1.5 ms at 16,000
    queued, in every release of a pooled attempt)."""
    statuses: list[ColumnElement[Any]] = [literal_column(f"'{s}'") for s in CLAIMABLE]
    pick = (
        select(i.id)
        .where(
            i.waiting_for == bindparam("name"),
            i.due_at.is_(None),
            i.status.concat("").in_(statuses),
            *also,
        )
        .order_by(i.priority.desc(), i.wait_due)
        .limit(bindparam("k", type_=Integer()))
    )
    return pick.with_for_update(skip_locked=True) if d.skip_locked else pick


_statements: weakref.WeakKeyDictionary[Engine, PoolStatements] = weakref.WeakKeyDictionary()


def statements(conn: Connection) -> PoolStatements:
    """The :class:`PoolStatements` of ``conn``'s engine (compiled on first use)."""
    try:
        return _statements[conn.engine]
    except KeyError:
        return _statements.setdefault(conn.engine, PoolStatements(conn.engine))
