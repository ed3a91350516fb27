"""Creating instances: the initial row of a flow's instance and its stored version.

Usable inside a caller's transaction (``flowrun start``, rules, tests), so an instance and
the flow version it refers to commit, or roll back, together.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, insert

from runner.flowspec import deadlines
from runner.labels import resolve
from runner.store.clock import db_now
from runner.store.db import insert_ignore
from runner.store.flow_limits import key_of
from runner.store.notify import notify_due
from runner.store.pools import declare
from runner.store.tables import flow_versions, instances
from runner.templating import render_label

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow


def record_version(conn: Connection, flow: CompiledFlow) -> None:
    """Store ``flow``'s source under its content hash (a no-op when already stored).

    Runs in the caller's transaction, so the version row commits (or rolls back) together
    with the instances that refer to it.

    Args:
        conn: a connection inside the caller's transaction.
        flow: a ``CompiledFlow`` (needs ``version``, ``name``, ``path``, ``source``).
    """
    at = db_now(conn)
    insert_ignore(
        conn,
        flow_versions,
        {
            "version": flow.version,
            "flow": flow.name,
            "path": str(flow.path),
            "source": flow.source,
            "loaded_at": at,
        },
    )
    if getattr(flow, "pools", None):  # the sizes of the pools it declares
        declare(conn, flow, at)


def initial_row(
    flow: CompiledFlow,
    data: dict[str, Any] | None,
    *,
    event_id: int | None,
    at: float,
    priority: int | None = None,
    event: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The column values of a new instance of ``flow`` (not yet inserted); its ``label`` is
    the flow's label template rendered over the merged data (``None`` without one); its
    ``priority`` (1..9) the one given (``flowrun start --priority``, kept in every state),
    else its initial state's (its own, else the flow's); its ``runs_on`` the initial
    state's requirement over the data and ``event`` (the fields of the event that started
    it, ``None``: none), of which ``route_event`` keeps those the flow's ``runs_on`` name
    (``CompiledFlow.route_fields``) for the states entered later."""
    state = flow.states[flow.initial]
    merged = {**flow.data, **(data or {})}
    extra = {}
    if getattr(flow, "has_deadlines", False):  # only then: no key for the others' inserts
        extra["deadline_at"] = deadlines.on_entry(flow, flow.initial, at, at)
    template = getattr(flow, "label", None)
    due: float | None
    status, due = "runnable", at
    if state.kind == "terminal":
        status, due = "completed", None
    elif state.kind == "external":
        due = None
    fields = getattr(flow, "route_fields", ())
    kept = {k: event[k] for k in fields if k in event} if event and fields else None
    routing = getattr(state, "routing", None)
    templates = routing.runs_on if routing is not None else None
    return {
        "flow": flow.name,
        "version": flow.version,
        "state": flow.initial,
        "status": status,
        "data": merged,
        "label": render_label(template, {"data": merged}) if template else None,
        "due_at": due,
        "fence": 0,
        "attempts": 0,
        "errors": 0,
        "restarts": 0,
        "state_errors": [],
        "state_restarts": 0,
        "state_changed": at,
        "created_at": at,
        "updated_at": at,
        "event_id": event_id,
        "priority": priority if priority is not None else getattr(state, "priority", 5),
        "start_priority": priority,
        "limit_key": key_of(flow, merged) if state.kind != "terminal" else None,
        "runs_on": resolve(templates, merged, event) if templates else None,
        "route_event": json.dumps(kept, sort_keys=True) if kept else None,
        **extra,
    }


def create_instance(
    conn: Connection,
    flow: CompiledFlow,
    data: dict[str, Any] | None = None,
    *,
    event_id: int | None = None,
    at: float | None = None,
    priority: int | None = None,
    event: dict[str, Any] | None = None,
) -> int:
    """Insert one instance of ``flow`` (a ``CompiledFlow``) and return its id.

    ``data`` is merged over the flow's default ``data``; ``priority`` (1..9, ``None``: the
    flow's and its states') overrides the flow's and every state's for this instance;
    ``event`` is the payload of the event that started it (``runs_on`` templates may name
    its fields).
    Runs inside the caller's transaction, so a rule can create the instance and mark its
    event handled atomically.
    """
    record_version(conn, flow)
    at = at if at is not None else db_now(conn)
    row = initial_row(flow, data, event_id=event_id, at=at, priority=priority, event=event)
    if row["due_at"] is not None:
        notify_due(conn, row["due_at"])
    return conn.execute(insert(instances).returning(instances.c.id), row).scalar_one()


def create_instances(
    conn: Connection,
    flow: CompiledFlow,
    datas: Sequence[dict[str, Any] | None],
    *,
    priority: int | None = None,
) -> int:
    """Insert many instances of ``flow`` in one statement (each of ``priority`` 1..9 when
    given, see :func:`create_instance`); returns how many."""
    record_version(conn, flow)
    at = db_now(conn)
    rows = [initial_row(flow, d, event_id=None, at=at, priority=priority) for d in datas]
    if rows:
        conn.execute(insert(instances), rows)
        notify_due(conn)
    return len(rows)
