"""Flow limits: ``max_running`` (optionally per key) and ``on_limit``, kept on the pool
machinery (``runner.store.pools``).

A flow with ``max_running`` has an implicit pool per key, named ``flow:<flow>`` (no key)
or ``flow:<flow>:<key>`` (the key template rendered over the instance's data when the
instance is made, stored in ``instances.limit_key``). Its size is the limit (a row of
``pools``, so ``flowrun pool ls`` shows it and ``flowrun pool set`` can change it). An
instance holds one slot of it while one of its attempts runs under a valid lease (a
chained move keeps it: the attempt row is still running); it is counted from the
``limit_key`` column, never written per claim. The claim keeps the limit in its own
transaction exactly as it keeps a pool's slots (``pool_settle.settle``); a refused claim waits
(``waiting_for`` the limit's name, not due) until a holder's attempt ends.

``on_limit: skip``: a rule's start is refused (:func:`refusal`) when ``limit`` instances
of the key are live in handler states (runnable or sleeping with an attempt running, due,
or waiting): counted after locking the limit's ``pools`` row, in the rule's transaction
(PostgreSQL: the row lock serialises the starts and claims of one key across daemons;
SQLite: the rule's ``BEGIN IMMEDIATE`` excludes every other writer), so two daemons can
never both start the last one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, or_, select

from runner.store.db import bound_idle
from runner.store.limit_names import PREFIX, describe, limit_name
from runner.store.pool_statements import statements
from runner.store.rows import CLAIMABLE
from runner.store.tables import instances

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

i = instances.c


def key_of(flow: CompiledFlow, data: Mapping[str, Any]) -> str | None:
    """The ``limit_key`` of a new instance of ``flow`` with ``data`` (merged), ``None``
    when the flow has no ``max_running``."""
    spec = getattr(flow, "max_running", None)
    if spec is None:
        return None
    return limit_name(flow.name, spec[1], data)


def running(conn: Connection, name: str, at: float, besides: Sequence[int] = ()) -> int:
    """Attempts holding limit ``name`` at ``at`` (epoch s): instances with that
    ``limit_key`` whose attempt runs under a valid lease, the instances ``besides`` (ids)
    not counted."""
    st = statements(conn)
    rows = st.limit_in_use.fetch(conn, {"name": name, "at": at, "ids": st.ids(list(besides))})
    return int(rows[0][0])


def live(conn: Connection, name: str) -> list[int]:
    """Ids of the instances of limit ``name`` live in handler states: runnable or sleeping
    with an attempt running, a due time or a wait (an instance parked in an ``external``
    state has none of them)."""
    q = select(i.id).where(
        i.flow == name[len(PREFIX) :].partition(":")[0],  # ix_instances_flow_status
        i.limit_key == name,
        i.status.in_(CLAIMABLE),
        or_(i.running_attempt.is_not(None), i.due_at.is_not(None), i.waiting_for.is_not(None)),
    )
    return list(conn.execute(q.order_by(i.id)).scalars())


def refusal(conn: Connection, flow: CompiledFlow, data: Mapping[str, Any], at: float) -> str | None:
    """For a rule about to start an instance of ``flow`` with ``data`` (the rule's data;
    merged over the flow's defaults here), in the rule's transaction: why the start is
    skipped (``on_limit: skip`` and the key's limit reached), or ``None`` to start it.
    Locks the limit's ``pools`` row until the transaction ends, or until the transaction
    sits idle past ``db.IDLE_IN_TRANSACTION`` (``db.bound_idle``)."""
    from runner.store.pools import lock  # pools imports this module

    spec = getattr(flow, "max_running", None)
    if spec is None or getattr(flow, "on_limit", "queue") != "skip":
        return None
    name = limit_name(flow.name, spec[1], {**(flow.data or {}), **dict(data)})
    bound_idle(conn)  # a daemon frozen holding the limit's row must not stall the claims
    size, _, _ = lock(conn, name, spec[0], at)
    ids = live(conn, name)
    if len(ids) < size:
        return None
    shown = ", ".join(map(str, ids[:10])) + (", ..." if len(ids) > 10 else "")
    return f"{describe(name)}: {len(ids)}/{size} live: {shown}"
