"""Acting on missed deadlines: the instances whose ``deadline_at`` has come, in one
transaction each batch.

For each instance due (``runner.store.deadlines.due_ids``, locked: on PostgreSQL two
daemons take different ones) the fault model's sibling ``runner.flowspec.deadlines.missed``
says what its missed deadlines do; this module writes it like an operator command
(``runner.ops.commands``): the instance row (moved to ``then``'s state, or ``failed``, or
``paused``; ``deadline_at`` the next pending deadline), its ``fence`` bumped when it moves
or changes status (an attempt in flight is cancelled by its worker, recorded
``cancelled``, nothing spent; an ``alert`` leaves it running), a ``commands`` row
(``deadline``, source ``deadline``: ``flowrun show`` and ``explain`` list it) and one
``deadline_missed`` lifecycle event per deadline missed, keyed by the deadline's time
(``"<id>:d<ms>"``): one event per missed deadline whatever the number of daemons.

An instance no longer live (completed, failed, killed) has its stale ``deadline_at``
cleared. Times are float epoch seconds on the database's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update

from runner import lifecycle
from runner.durations import format_duration
from runner.flowspec import deadlines
from runner.ops.commands import _close_orphan_attempt
from runner.store.clock import db_now
from runner.store.deadlines import LIVE, due_ids
from runner.store.leases import decode_event
from runner.store.lifecycle_events import emit, transition
from runner.store.notify import notify_due
from runner.store.tables import commands, instances
from runner.store.versions import compiled

#: Instances acted on in one transaction at most.
BATCH = 100


@dataclass(frozen=True)
class Missed:
    """One deadline missed, as written (for the daemon's WARNING line and tests).

    Attributes:
        instance: the instance id; flow: its flow; state: its state when missed.
        then: what the deadline did (a state, ``failed``, ``paused``, ``alert``).
        due: the deadline's time (epoch s); at: when it was acted on.
        text: the sentence stored in the command row.
    """

    instance: int
    flow: str
    state: str
    then: str
    due: float
    at: float
    text: str


def describe_miss(miss: deadlines.Miss) -> str:
    """``"state 'wait' deadline (2s after entering it) → escalate"``."""
    d = miss.deadline
    whose = "the flow's" if d.scope == "flow" else f"state {miss.state!r}"
    since = "its start" if d.since == "created" else "entering it"
    return f"{whose} deadline ({format_duration(d.after)} after {since}) → {d.then}"


def fire_due(engine: Engine, worker_id: str | None, limit: int = BATCH) -> list[Missed]:
    """Act on up to ``limit`` instances whose deadline has come, in one transaction;
    returns the deadlines missed (empty: none was due)."""
    with engine.begin() as conn:
        at = db_now(conn)
        ids = due_ids(conn, at, limit)
        if not ids:
            return []
        rows = conn.execute(select(instances).where(instances.c.id.in_(ids))).mappings().all()
        out: list[Missed] = []
        events: list[tuple[str, dict[str, Any]]] = []
        due: list[float] = []
        for row in rows:
            values, missed = _plan(conn, row, at)
            if missed and ("state" in values or "status" in values):
                values["fence"] = instances.c.fence + 1  # an attempt in flight is cancelled
                _close_orphan_attempt(
                    conn, row, at, same_state=values.get("state", row["state"]) == row["state"]
                )
            if missed:
                values["updated_at"] = at
            conn.execute(update(instances).where(instances.c.id == row["id"]).values(**values))
            after = {**row, **{k: v for k, v in values.items() if k in ("state", "status")}}
            for m in missed:
                text = describe_miss(m)
                conn.execute(
                    insert(commands).values(
                        instance_id=row["id"],
                        command="deadline",
                        args={
                            "then": m.deadline.then,
                            "scope": m.deadline.scope,
                            "due": m.due,
                            "state": m.state,
                            "to": values.get("state"),
                            "status": values.get("status"),
                        },
                        source="deadline",
                        created_at=at,
                        status="applied",
                        result=text,
                    )
                )
                key = f"{row['id']}:d{round(m.due * 1000)}"
                events.append(transition(key, after, "deadline_missed", worker_id, at))
                out.append(
                    Missed(row["id"], row["flow"], m.state, m.deadline.then, m.due, at, text)
                )
            if after["status"] == "runnable" and values.get("due_at", row["due_at"]) is not None:
                due.append(values.get("due_at", row["due_at"]))
        if due:
            notify_due(conn, min(due))
        emit(conn, events)
        return out


def _plan(conn: Any, row: Any, at: float) -> tuple[dict[str, Any], list[deadlines.Miss]]:
    """The column values of instance ``row`` after its deadlines due at ``at``, and the
    deadlines missed."""
    if row["status"] not in LIVE:
        return {"deadline_at": None}, []  # ended meanwhile: nothing is left to wait for
    try:
        flow = compiled(conn, row["version"])
    except Exception:  # noqa: BLE001 - a version that no longer compiles: no deadline known
        return {"deadline_at": None}, []
    f = deadlines.missed(
        flow, row["state"], row["state_changed"], row["created_at"], row["deadline_at"], at
    )
    values: dict[str, Any] = {"deadline_at": f.next_at}
    status = row["status"]
    if f.state is not None:
        event = decode_event(row["route_event"])  # its runs_on over the starting event
        values.update(lifecycle.enter_state(flow, f.state, at, row["data"], event))
        if status == "paused" and values["status"] == "runnable":
            values["status"] = "paused"  # a paused instance moves but stays paused (send)
        status = values["status"]
    if f.status == "failed":
        values.update(status=lifecycle.check(status, "expire", row["id"]), due_at=None)
    elif f.status == "paused" and status != "paused" and lifecycle.allowed(status, "pause"):
        values["status"] = lifecycle.check(status, "pause", row["id"])
    if values.get("status") == row["status"] and "state" not in values:
        del values["status"]
    return values, f.misses
