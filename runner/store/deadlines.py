"""Deadlines in the database: ``instances.deadline_at``, set on entering a state, read by
the daemon that acts on them.

``deadline_at`` is the earliest deadline of an instance not acted on yet
(``runner.flowspec.deadlines``); ``NULL`` for the instances of flows without deadlines,
which never pay for any of this (a partial index, ``ix_instances_deadline``, holds only
the others). Whoever moves an instance into a state of a flow with deadlines sets it in
the same transaction: a new instance (``runner.store.create``), the worker's commit of a
move (:func:`entered`), an operator's ``send`` or ``migrate``, a ``routing_timeout``'s
move (``runner.store.routing``) and the deadline's own move (``runner.ops.deadlines``).
A daemon reads the smallest value (:func:`next_due`) and sleeps until then;
:func:`due_ids` are the instances whose time has come.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, select, update

from runner.flowspec import deadlines
from runner.store.dialect import dialect_of
from runner.store.tables import instances

#: The statuses of an instance that is still going (its deadlines still act).
LIVE = ("runnable", "sleeping", "paused")


def entered(conn: Connection, moves: Iterable[tuple[int, Any, str, float]]) -> int:
    """Set ``deadline_at`` of instances that just entered a state, inside ``conn``'s
    transaction; returns how many rows were written.

    Args:
        moves: ``(instance id, CompiledFlow, state entered, when (epoch s))``, only for
            flows with deadlines (:attr:`CompiledFlow.has_deadlines`).
    """
    moves = list(moves)
    if not moves:
        return 0
    i = instances.c
    rows = {
        r.id: r
        for r in conn.execute(
            select(i.id, i.created_at, i.deadline_at).where(i.id.in_([m[0] for m in moves]))
        )
    }
    values = [
        {
            "b_id": iid,
            "b_deadline": deadlines.on_entry(
                flow, state, at, rows[iid].created_at, rows[iid].deadline_at
            ),
        }
        for iid, flow, state, at in moves
        if iid in rows
    ]
    if values:
        conn.execute(
            update(instances)
            .where(i.id == bindparam("b_id"))
            .values(deadline_at=bindparam("b_deadline")),
            values,
        )
    return len(values)


def next_due(engine: Engine) -> float | None:
    """The earliest ``deadline_at`` of any instance (epoch s), ``None`` for none; one read
    of ``ix_instances_deadline``."""
    i = instances.c
    with engine.connect() as conn:
        q = select(func.min(i.deadline_at)).where(i.deadline_at.is_not(None))
        return conn.execute(q).scalar()


def due_ids(conn: Connection, now: float, limit: int) -> list[int]:
    """Up to ``limit`` instances whose ``deadline_at`` has come by ``now``, earliest first,
    locked for the caller's transaction (``SKIP LOCKED`` on PostgreSQL: two daemons take
    different ones)."""
    i = instances.c
    q = (
        select(i.id)
        .where(i.deadline_at.is_not(None), i.deadline_at <= now)
        .order_by(i.deadline_at)
        .limit(limit)
    )
    if dialect_of(conn).skip_locked:
        q = q.with_for_update(skip_locked=True)
    return list(conn.execute(q).scalars())
