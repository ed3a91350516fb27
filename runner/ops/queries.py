"""The read side shared by the CLI and the console: listings, counts, one instance.

Timestamps leave here as ISO 8601 UTC strings (``--json``) via :func:`iso`; the database
keeps float epoch seconds.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, String, cast, func, or_, select

from runner.store.db import reading
from runner.store.tables import attempts, commands, instances

INSTANCE_KEYS = (
    "id",
    "flow",
    "label",
    "state",
    "status",
    "data",
    "attempts",
    "errors",
    "restarts",
    "due_at",
    "locked_by",
    "locked_until",
    "created_at",
    "updated_at",
)
_TIME_KEYS = ("due_at", "locked_until", "created_at", "updated_at", "state_changed")
SORTABLE = (
    "id",
    "flow",
    "state",
    "status",
    "attempts",
    "errors",
    "restarts",
    "due_at",
    "updated_at",
)


def iso(ts: float | None) -> str | None:
    """Epoch seconds → ISO 8601 UTC with milliseconds and a ``Z`` (``None`` stays ``None``)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def instance_json(row: Any) -> dict:
    """The ``--json`` object of one instance row (a mapping of ``instances`` columns)."""
    out = {k: row[k] for k in INSTANCE_KEYS}
    out.update(
        version=row["version"],
        state_restarts=row["state_restarts"],
        state_errors=len(row["state_errors"] or []),
        last_error=row["last_error"],
        state_changed=row["state_changed"],
        running_attempt=row["running_attempt"],
    )
    for k in _TIME_KEYS:
        out[k] = iso(out[k])
    return out


def list_instances(
    engine: Engine,
    *,
    flow: str | None = None,
    status: str | None = None,
    text: str | None = None,
    order_by: str = "id",
    desc: bool = False,
    offset: int = 0,
    limit: int | None = None,
) -> list[dict]:
    """One page of instances as ``instance_json`` dicts.

    ``text`` matches (case-insensitively) the flow, label, state, status, last error or the
    data's JSON text. ``order_by`` is one of ``SORTABLE``.
    """
    q = _filtered(select(instances), flow, status, text)
    col = instances.c[order_by if order_by in SORTABLE else "id"]
    q = q.order_by(
        col.desc() if desc else col.asc(), instances.c.id.desc() if desc else instances.c.id
    )
    if limit is not None:
        q = q.limit(limit).offset(offset)
    with reading(engine) as conn:
        return [instance_json(r) for r in conn.execute(q).mappings()]


def _filtered(q, flow, status, text):
    if flow:
        q = q.where(instances.c.flow == flow)
    if status:
        q = q.where(instances.c.status == status)
    if text:
        like = f"%{text.lower()}%"
        q = q.where(
            or_(
                func.lower(instances.c.flow).like(like),
                func.lower(func.coalesce(instances.c.label, "")).like(like),
                func.lower(instances.c.state).like(like),
                func.lower(instances.c.status).like(like),
                func.lower(func.coalesce(instances.c.last_error, "")).like(like),
                func.lower(cast(instances.c.data, String)).like(like),
            )
        )
    return q


def count_by_status(engine: Engine, flow: str | None = None) -> dict[str, int]:
    """``{status: count}`` over all instances (or one flow's)."""
    q = select(instances.c.status, func.count()).group_by(instances.c.status)
    if flow:
        q = q.where(instances.c.flow == flow)
    with reading(engine) as conn:
        return dict(conn.execute(q).all())


def attempt_json(row: Any) -> dict:
    """The ``history`` entry of one attempt row."""
    return {
        "attempt": row["attempt"],
        "state": row["state"],
        "worker": row["worker"],
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
        "duration": (
            round(row["finished_at"] - row["started_at"], 6) if row["finished_at"] else None
        ),
        "outcome": row["outcome"],
        "to_state": row["to_state"],
        "error": row["error"],
        "checkpoint": row["checkpoint"],
    }


def with_running(row: Any, history: list[Any]) -> list[dict]:
    """``history`` (attempt rows, newest first) with the attempt running now in front.

    An attempt's row is written when it ends (or at its first checkpoint); until then the
    instance row names it: ``running_attempt``, its worker ``locked_by`` and its start
    ``state_attempted``. Returns plain dicts, newest first; the running attempt has
    ``outcome`` ``None``.
    """
    out = [dict(a) for a in history]
    number = row["running_attempt"]
    if number is not None and not any(a["attempt"] == number for a in out):
        out.insert(
            0,
            {
                "id": None,
                "instance_id": row["id"],
                "attempt": number,
                "state": row["state"],
                "worker": row["locked_by"],
                "fence": row["fence"],
                "started_at": row["state_attempted"],
                "finished_at": None,
                "outcome": None,
                "to_state": None,
                "error": None,
                "checkpoint": None,
            },
        )
    return out


def get_instance(engine: Engine, instance_id: int, *, history_limit: int = 500) -> dict | None:
    """One instance with ``history`` (its attempts, oldest first, the last
    ``history_limit``), ``checkpoints`` and ``commands``; ``None`` when unknown."""
    with reading(engine) as conn:
        found = _read_instance(conn, instance_id, history_limit)
    if found is None:
        return None
    row, att, cmds = found
    out = instance_json(row)
    out["state_error_times"] = [iso(t) for t in row["state_errors"] or []]
    out["budget"] = _budget(engine, row)
    out["history"] = [attempt_json(a) for a in reversed(att)]
    out["checkpoints"] = [
        {"attempt": a["attempt"], "state": a["state"], "checkpoint": a["checkpoint"]}
        for a in reversed(att)
        if a["checkpoint"] is not None
    ]
    out["commands"] = [
        {
            "command": c["command"],
            "args": c["args"],
            "source": c["source"],
            "at": iso(c["created_at"]),
            "status": c["status"],
            "result": c["result"],
        }
        for c in cmds
    ]
    return out


def list_workers(engine: Engine, *, now: float | None = None) -> list[dict]:
    """Every worker row, newest heartbeat first, timestamps as ISO 8601 UTC.

    Each row adds the liveness verdict of ``runner.ops.liveness.judge``: ``alive`` (bool),
    ``verdict`` (alive/late/dead/stopped), ``heartbeat_age`` (seconds), ``leases`` (valid
    instance and sensor leases it holds) and ``lease_until`` (when the last expires). A
    worker is dead only when its heartbeat is stale AND it holds no valid lease.
    """
    import time

    from runner.ops.liveness import judge
    from runner.store.tables import sensors, workers

    at = time.time() if now is None else now
    held: dict[str, list] = {}
    with reading(engine) as conn:
        rows = conn.execute(select(workers).order_by(workers.c.heartbeat_at.desc())).mappings()
        rows = [dict(r) for r in rows]
        for table in (instances, sensors):
            q = (
                select(table.c.locked_by, func.count(), func.max(table.c.locked_until))
                .where(table.c.locked_by.is_not(None), table.c.locked_until > at)
                .group_by(table.c.locked_by)
            )
            for who, count, until in conn.execute(q):
                entry = held.setdefault(who, [0, None])
                entry[0] += count
                entry[1] = until if entry[1] is None else max(entry[1], until)
    out = []
    for r in rows:
        count, until = held.get(r["id"], (0, None))
        verdict = judge(r["heartbeat_at"], r["stopped_at"], at, leases=count, lease_until=until)
        out.append(
            {
                **r,
                **{k: iso(r[k]) for k in ("started_at", "heartbeat_at", "stopped_at")},
                "alive": verdict.alive,
                "verdict": verdict.verdict,
                "heartbeat_age": round(verdict.heartbeat_age, 3),
                "leases": verdict.leases,
                "lease_until": iso(verdict.lease_until),
            }
        )
    return out


def _budget(engine: Engine, row: Any) -> dict | None:
    """The error budget of the instance's current state (``None`` when its flow version
    no longer compiles), from the stored error timestamps."""
    from runner import lifecycle
    from runner.errors import UserError
    from runner.store import versions

    try:
        policy = versions.compiled(engine, row["version"]).states[row["state"]].policy
    except (UserError, KeyError):
        return None
    return lifecycle.budget(row["state_errors"], time.time(), policy, row["state_restarts"])


def instance_rows(engine: Engine, instance_id: int) -> dict | None:
    """The raw rows behind one instance, for reasoning over its history (``runner.ops.explain``).

    Returns ``None`` for an unknown id, else ``{"instance": {...}, "attempts": [...],
    "commands": [...], "event": {...} | None}``: plain dicts of the table columns with
    float epoch seconds (no ISO conversion), attempts oldest first with the attempt
    running now (from the instance row, ``outcome`` ``None``) last, commands in the order
    they were written, and the sensor event that started the instance, if any.
    """
    from runner.store.tables import events

    with reading(engine) as conn:
        found = _read_instance(conn, instance_id, None)
        if found is None:
            return None
        row, att, cmds = found
        event = None
        if row["event_id"] is not None:
            found = (
                conn.execute(select(events).where(events.c.id == row["event_id"]))
                .mappings()
                .first()
            )
            event = dict(found) if found is not None else None
    return {
        "instance": dict(row),
        "attempts": list(reversed(att)),
        "commands": [dict(c) for c in cmds],
        "event": event,
    }


def _read_instance(conn, instance_id: int, history_limit: int | None):
    """``(row, attempts, commands)`` of one instance inside a reading transaction, or
    ``None``: its row, its attempt rows newest first (the last ``history_limit``, or all)
    with the running one in front (:func:`with_running`), its command rows in order."""
    row = conn.execute(select(instances).where(instances.c.id == instance_id)).mappings().first()
    if row is None:
        return None
    q = (
        select(attempts)
        .where(attempts.c.instance_id == instance_id)
        .order_by(attempts.c.attempt.desc())
    )
    att = conn.execute(q if history_limit is None else q.limit(history_limit)).mappings().all()
    att = with_running(row, att)[:history_limit]
    cmds = conn.execute(
        select(commands).where(commands.c.instance_id == instance_id).order_by(commands.c.id)
    ).mappings()
    return row, att, cmds.all()
