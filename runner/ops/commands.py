"""Operator and rule commands, stored as data and applied in one transaction.

After rq's ``command.py`` (commands are rows, not calls into a worker), but applied where
they are issued: the database is the coordinator (Stator), so a pause typed while no
daemon runs takes effect all the same. Each command

1. is checked against the status lifecycle (``runner.lifecycle``) — a refusal is a clear
   message, e.g. "cannot resume: instance 42 is completed";
2. updates the instance and bumps its ``fence``, so an attempt in flight can commit
   nothing; the worker holding the lease notices within its poll interval and cancels
   the attempt (a terminated process group, a cancelled coroutine), recorded ``cancelled``;
3. writes a ``commands`` row (``applied`` or ``refused``) — the audit trail.

The CLI, the console and rules all go through :func:`submit` / :func:`apply`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Engine, insert, select, update

from runner import lifecycle
from runner.errors import IllegalMove, UserError
from runner.store.clock import db_now
from runner.store.db import reading
from runner.store.deadlines import entered
from runner.store.hot import hot_for
from runner.store.leases import decode_event
from runner.store.lifecycle_events import emit, transition
from runner.store.notify import notify_due
from runner.store.rows import running_attempt_row
from runner.store.tables import commands, instances
from runner.store.versions import compiled
from runner.warn_line import warn

#: The daemon's rules apply commands here: a kill they make is one WARNING line.
log = logging.getLogger("flowrun.rules")


@dataclass
class CommandResult:
    """The result of one command on one instance (``ok`` False: refused, ``message`` why)."""

    instance_id: int
    command: str
    ok: bool
    message: str


def submit(
    engine: Engine,
    ids: Iterable[int],
    command: str,
    *,
    event: str | None = None,
    source: str = "cli",
    until: float | None = None,
) -> list[CommandResult]:
    """Apply ``command`` to each instance in ``ids`` in one transaction.

    Args:
        engine: the database.
        ids: instance ids.
        command: one of pause, resume, kill, retry, send, sleep, wake.
        event: the event name, for ``send``.
        source: who asked ("cli", "tui", "rule:<flow>.<sensor>").
        until: for ``sleep``, when the instance wakes (epoch seconds, UTC).
    """
    with engine.begin() as conn:
        return apply(conn, ids, command, event=event, source=source, until=until)


def apply(
    conn: Connection,
    ids: Iterable[int],
    command: str,
    *,
    event: str | None = None,
    source: str = "rule",
    until: float | None = None,
    tag: dict[str, Any] | None = None,
) -> list[CommandResult]:
    """Like :func:`submit`, inside the caller's transaction (rules mark their event handled
    in the same one). Unknown ids yield a refused result "no instance N". ``tag`` is
    stored in each command row's ``args`` (a rule's ``{"event_id": N}``)."""
    if command not in lifecycle.OPERATOR_COMMANDS:
        expected = ", ".join(lifecycle.OPERATOR_COMMANDS)
        raise UserError(f"unknown command {command!r} (expected one of: {expected})", 2)
    if command == "send" and not event:
        raise UserError("send needs an event name", 2)
    if command == "sleep" and until is None:
        raise UserError("sleep needs a wake time", 2)
    at = db_now(conn)  # the database's clock: a lease is judged as its holder set it
    results = []
    due: list[float] = []  # due times the commands made, for the listening daemons
    # lifecycle events (``runner.store.lifecycle_events``)
    transitions: list[tuple[str, dict[str, Any]]] = []
    ids = list(dict.fromkeys(ids))  # each instance once, in the order given
    rows = {
        r["id"]: r
        for r in conn.execute(select(instances).where(instances.c.id.in_(ids))).mappings()
    }
    for iid in ids:
        row = rows.get(iid)
        if row is None:
            results.append(CommandResult(iid, command, False, f"no instance {iid}"))
            continue
        try:
            values, message = _plan(conn, row, command, event, at, until)
        except IllegalMove as exc:
            results.append(CommandResult(iid, command, False, str(exc)))
            _log(conn, iid, command, event, source, at, "refused", str(exc), until, tag)
            continue
        values.update(fence=instances.c.fence + 1, updated_at=at)
        if "priority" in values and row["start_priority"] is not None:
            values["priority"] = row["start_priority"]  # the start's wins over a state's
        conn.execute(update(instances).where(instances.c.id == iid).values(**values))
        _close_orphan_attempt(
            conn, row, at, same_state=values.get("state", row["state"]) == row["state"]
        )
        if "state_changed" in values:  # a state entered: its deadlines (store.deadlines)
            flow = compiled(conn, row["version"])
            if flow.has_deadlines:
                entered(conn, [(iid, flow, values["state"], at)])
        _log(conn, iid, command, event, source, at, "applied", message, until, tag)
        results.append(CommandResult(iid, command, True, message))
        if command == "kill" and source.startswith("rule:"):  # in the daemon: its log says so
            warn(log, iid, row["flow"], row["state"], "killed", f"killed by {source}")
        moved = _lifecycle_row(row, values, command, at)
        if moved is not None:
            transitions.append(moved)
        if values.get("status", row["status"]) == "runnable":
            due.append(values.get("due_at", row["due_at"]) or at)
    if due:
        notify_due(conn, min(due))
    emit(conn, transitions)  # lifecycle events, in the command's transaction
    return results


#: The lifecycle event kind of each command (a ``send`` only when it completes).
_COMMAND_KINDS = {"kill": "killed", "pause": "paused", "resume": "resumed", "retry": "retried"}


def _lifecycle_row(
    row: Any, values: dict[str, Any], command: str, at: float
) -> tuple[str, dict[str, Any]] | None:
    """The lifecycle transition (``lifecycle_events.transition``) a command applied to
    instance ``row`` made, or ``None``."""
    status = values.get("status", row["status"])
    kind = "completed" if status == "completed" else _COMMAND_KINDS.get(command)
    if kind is None:
        return None
    after = {**row, "state": values.get("state", row["state"]), "status": status}
    return transition(f"{row['id']}:f{row['fence'] + 1}", after, kind, None, at)


def _plan(
    conn: Connection, row, command: str, event: str | None, at: float, until: float | None = None
) -> tuple[dict[str, Any], str]:
    iid, status = row["id"], row["status"]
    if command in ("sleep", "wake"):
        return _sleep_plan(conn, row, command, at, until)
    if command == "send":
        lifecycle.check(status, "send", iid)
        flow = compiled(conn, row["version"])
        target = flow.event_target(row["state"], cast(str, event))  # send names its event
        values = lifecycle.enter_state(
            flow, target, at, row["data"], decode_event(row["route_event"])
        )
        if status == "paused" and values["status"] == "runnable":
            values["status"] = "paused"  # a paused instance moves but stays paused
        return values, f"instance {iid}: {row['state']} --{event}--> {target}"
    new_status = lifecycle.check(status, command, iid)
    values = {"status": new_status}
    if command == "resume":
        values["due_at"] = _resume_due(conn, row, at)
    elif command in ("kill", "pause"):
        values["due_at"] = None if command == "kill" else row["due_at"]
    elif command == "retry":
        flow = compiled(conn, row["version"])
        values.update(
            due_at=None if flow.states[row["state"]].kind == "external" else at,
            state_errors=[],
            state_restarts=0,
        )
    return values, f"instance {iid}: {status} -> {new_status}"


def _sleep_plan(
    conn: Connection, row, command: str, at: float, until: float | None
) -> tuple[dict[str, Any], str]:
    """``sleep``: sleeping until ``until`` in the same state, nothing spent (Metafora's
    Sleep); ``wake``: a sleeping instance due at once (Metafora's Run). A state without a
    handler (``external``) waits for an event, not a time: refused."""
    from runner.ops.views import iso

    iid, status = row["id"], row["status"]
    new_status = lifecycle.check(status, command, iid)
    if command == "wake":
        return {"status": new_status, "due_at": at}, f"instance {iid}: {status} -> {new_status}"
    flow = compiled(conn, row["version"])
    if flow.states[row["state"]].kind == "external":
        raise IllegalMove(
            f"cannot sleep: instance {iid} is in {row['state']!r}, which waits for an event"
        )
    return (
        {"status": new_status, "due_at": until},
        f"instance {iid}: {status} -> sleeping until {iso(until)}",
    )


def _resume_due(conn: Connection, row, at: float) -> float | None:
    flow = compiled(conn, row["version"])
    return None if flow.states[row["state"]].kind == "external" else at


def _close_orphan_attempt(conn: Connection, row, at: float, *, same_state: bool) -> None:
    """An attempt still running under a lease that already expired is recorded ``lost``.

    Like a lost attempt found by ``store.recover_lost``, it counts one restart (the
    state's too, unless the command moved the instance to another state, whose counters
    start at zero), but the command's own outcome wins: no fault-model verdict is applied
    (never ``failed`` for spent restarts; why: ``runner.flowspec.faults``, "Not here").
    """
    if row["running_attempt"] is None:
        return
    if row["locked_until"] is not None and row["locked_until"] >= at:
        return  # the owner is alive: it cancels the attempt itself
    error = f"lost: worker {row['locked_by']}'s lease had expired"
    hot_for(conn).close_attempts.executemany(conn, [running_attempt_row(row, at, "lost", error)])
    conn.execute(
        update(instances)
        .where(instances.c.id == row["id"])
        .values(
            running_attempt=None,
            locked_by=None,
            locked_until=None,
            restarts=instances.c.restarts + 1,
            state_restarts=instances.c.state_restarts + (1 if same_state else 0),
        )
    )


def _log(conn, iid, command, event, source, at, status, message, until=None, tag=None) -> None:
    args: dict[str, Any] = {"event": event} if event else {}
    args.update(tag or {})
    if command == "sleep":
        args["until"] = until
    conn.execute(
        insert(commands).values(
            instance_id=iid,
            command=command,
            args=args,
            source=source,
            created_at=at,
            status=status,
            result=message,
        )
    )


def select_ids(
    conn: Connection,
    *,
    flow: str | None = None,
    state: str | None = None,
    status: str | Iterable[str] | None = None,
    data_match: dict[str, str] | None = None,
) -> list[int]:
    """Ids of instances matching every given filter.

    ``data_match`` maps a data key to a regex (``re.search`` on ``str(value)``); an
    instance without the key does not match.
    """
    q = select(instances.c.id, instances.c.data)
    if flow:
        q = q.where(instances.c.flow == flow)
    if state:
        q = q.where(instances.c.state == state)
    if status:
        statuses = [status] if isinstance(status, str) else list(status)
        q = q.where(instances.c.status.in_(statuses))
    patterns = {k: re.compile(v) for k, v in (data_match or {}).items()}
    ids = []
    for iid, data in conn.execute(q.order_by(instances.c.id)):
        data = data or {}
        if all(k in data and p.search(str(data[k])) for k, p in patterns.items()):
            ids.append(iid)
    return ids


def allowed_events(engine: Engine, instance_id: int) -> list[str]:
    """The ``on:`` events the instance's current state accepts (empty when none)."""
    with reading(engine) as conn:
        row = conn.execute(
            select(instances.c.version, instances.c.state).where(instances.c.id == instance_id)
        ).first()
    if row is None:
        raise UserError(f"no instance {instance_id}", 1)
    return compiled(engine, row.version).events_from(row.state)
