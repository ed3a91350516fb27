"""Routing by label, the store's side: which live workers match a requirement, and the
``routing_timeout`` of instances no live worker has matched.

The claim itself keeps the requirement (``runner.store.hot.claim_statement``: a worker
claims only instances whose ``runs_on`` its labels cover), so an instance waiting for a
matching worker is never claimed by another one: nothing is spent. This module is the
rest, run by every worker with its periodic look for lost attempts (:func:`sweep`, at
most once a second, in the cycle's transaction): for each requirement of a due, unlocked
instance (read by the partial index ``ix_instances_runs_on``) it asks whether a live
worker matches (its row in ``workers``: labels covering the requirement, not stopped, a
heartbeat fresher than ``STALE_BEATS`` of its intervals); if none does, the instances of
states with a ``routing_timeout`` that have waited that long since both their due time
and the last moment a matching worker was alive move to the timeout's ``then`` (a state,
or ``failed``; a state entered gets its ``runs_on`` and its ``deadline_at``), fenced like
a command and recorded as a ``route`` command row (source ``routing``) that ``explain``
shows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from runner import lifecycle
from runner.errors import UserError
from runner.flowspec import deadlines
from runner.labels import decode, match, resolve, show
from runner.store import versions
from runner.store.dialect import dialect_of
from runner.store.lifecycle_events import emit, transition
from runner.store.rows import CLAIMABLE, due_clause
from runner.store.tables import commands, instances, workers

i = instances.c
#: The most instances one sweep moves per requirement (the next sweep takes the rest).
BATCH = 500


def worker_rows(conn: Connection) -> list[Any]:
    """Every worker's ``(labels, heartbeat_at, heartbeat_every, stopped_at)``."""
    w = workers.c
    q = select(w.labels, w.heartbeat_at, w.heartbeat_every, w.stopped_at)
    return list(conn.execute(q))


def route_of(flow: Any, state: str, row: Mapping[str, Any]) -> str | None:
    """The requirement (stored text) of ``state`` of ``flow`` (a ``CompiledFlow``) for
    the instance ``row`` (its ``data`` and ``route_event``)."""
    st = flow.states.get(state)
    templates = st.routing.runs_on if st is not None else None
    event = json.loads(row["route_event"]) if row.get("route_event") else None
    return resolve(templates, row.get("data"), event)


def sweep(conn: Connection, at: float) -> int:
    """Move the instances whose ``routing_timeout`` passed with no live matching worker
    (see the module docstring); returns how many moved. In the caller's transaction;
    one grouped read of ``ix_instances_runs_on`` when nothing is routed."""
    due = due_clause(at)
    # the requirements of live instances: a read of the partial index (empty when
    # nothing is routed), each row's status checked; the due rows are read below
    live = i.status.in_(CLAIMABLE)
    q = select(i.runs_on).where(i.runs_on.is_not(None), live).distinct()
    required = [r for r in conn.execute(q).scalars() if r]
    if not required:
        return 0
    rows = worker_rows(conn)
    moved = 0
    for text in required:
        m = match(rows, decode(text), at)
        if m.alive:
            continue
        since = m.last if m.last is not None else 0.0
        states = select(i.version, i.state, func.min(i.due_at))
        states = states.where(i.runs_on == text, due).group_by(i.version, i.state)
        for version, state, first in conn.execute(states):
            routing = _routing(conn, version, state)
            if routing is None or routing.after is None:
                continue
            if max(first, since) + routing.after > at:
                continue
            cutoff = at - routing.after
            moved += _move(conn, version, state, text, routing, cutoff, since, at)
    return moved


def _routing(conn: Connection, version: str, state: str) -> Any:
    try:
        st = versions.compiled(conn, version).states.get(state)
    except UserError:
        return None
    return None if st is None else st.routing


def _move(
    conn: Connection,
    version: str,
    state: str,
    required: str,
    routing: Any,
    cutoff: float,
    since: float,
    at: float,
) -> int:
    """Move the due instances of ``version``/``state`` with requirement ``required``
    that are due since ``cutoff`` or earlier to ``routing.then``, if no matching worker
    was alive after ``cutoff`` (``since``); returns how many."""
    if since > cutoff:
        return 0
    cols = (i.id, i.fence, i.data, i.route_event, i.status, i.flow, i.attempts, i.errors)
    q = select(*cols, i.restarts, i.created_at, i.deadline_at).where(
        i.runs_on == required,
        i.version == version,
        i.state == state,
        i.due_at <= cutoff,
        due_clause(at),
    )
    q = q.limit(BATCH)
    if dialect_of(conn).skip_locked:
        q = q.with_for_update(skip_locked=True)
    flow = versions.compiled(conn, version)
    gone = "never" if since <= 0 else f"none alive since {_clock(since)}"
    why = f"routing_timeout: no live worker with {show(required)} ({gone})"
    count = 0
    failed: list[tuple[str, dict[str, Any]]] = []  # lifecycle events (``on_failure``)
    for row in conn.execute(q).mappings().all():
        if routing.then == "failed":
            values: dict[str, Any] = {"status": "failed", "due_at": None}
            message = f"{why}: failed"
        else:
            values = lifecycle.enter_state(
                flow,
                routing.then,
                at,
                row["data"],
                json.loads(row["route_event"]) if row["route_event"] else None,
            )
            message = f"{why}: moved to {routing.then}"
            if flow.has_deadlines:  # the state entered: its deadlines (store.deadlines)
                values["deadline_at"] = deadlines.on_entry(
                    flow, routing.then, at, row["created_at"], row["deadline_at"]
                )
        values.update(fence=i.fence + 1, updated_at=at, last_error=message)
        done = conn.execute(
            update(instances)
            .where(i.id == row["id"], i.fence == row["fence"], i.running_attempt.is_(None))
            .values(**values)
        )
        if not done.rowcount:
            continue
        conn.execute(
            insert(commands).values(
                instance_id=row["id"],
                command="route",
                args={"state": routing.then, "from_state": state, "runs_on": decode(required)},
                source="routing",
                created_at=at,
                status="applied",
                result=message,
            )
        )
        count += 1
        if routing.then == "failed":
            after = {**row, "version": version, "state": state, **values, "last_error": message}
            failed.append(transition(f"{row['id']}:f{row['fence'] + 1}", after, "failed", None, at))
    emit(conn, failed)  # in the move's transaction; nothing when no sensor listens
    return count


def _clock(at: float) -> str:
    """``at`` (epoch s) as ``HH:MM:SS`` UTC."""
    return time.strftime("%H:%M:%S", time.gmtime(at))
