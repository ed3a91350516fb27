"""What the read side hands to people and to ``--json``: ISO 8601 times and the JSON
shapes of an instance and an attempt.

Timestamps leave here as ISO 8601 UTC strings via :func:`iso`; the database keeps float
epoch seconds. Pure: no database.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from runner.labels import decode

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.facts import FlowFacts

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
    "waiting_for",
    "priority",
)
_TIME_KEYS = ("due_at", "locked_until", "created_at", "updated_at", "state_changed")
#: The columns :func:`instance_json` reads.
JSON_KEYS = (
    *INSTANCE_KEYS,
    "version",
    "state_restarts",
    "state_errors",
    "last_error",
    "state_changed",
    "running_attempt",
    "runs_on",
)
#: The columns ``flowrun ls`` shows (its table needs no data and no error times; the
#: version names the events an instance in an external state waits for).
TABLE_KEYS = (
    *(k for k in INSTANCE_KEYS if k not in ("data", "created_at", "updated_at")),
    "last_error",
    "running_attempt",
    "version",
)


def iso(ts: float | None) -> str | None:
    """Epoch seconds → ISO 8601 UTC with milliseconds and a ``Z`` (``None`` stays ``None``)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def instance_json(row: Any) -> dict[str, Any]:
    """The ``--json`` object of one instance row (a mapping of ``instances`` columns)."""
    out = {k: row[k] for k in INSTANCE_KEYS}
    out.update(
        version=row["version"],
        state_restarts=row["state_restarts"],
        state_errors=len(row["state_errors"] or []),
        last_error=row["last_error"],
        state_changed=row["state_changed"],
        running_attempt=row["running_attempt"],
        # its state's requirement (``runner.labels``): {} for none
        runs_on=decode(row["runs_on"]) if "runs_on" in row else {},
    )
    for k in _TIME_KEYS:
        out[k] = iso(out[k])
    return out


def attempt_json(row: Any) -> dict[str, Any]:
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


def waits_for(row: Any, flow: CompiledFlow | FlowFacts | None) -> tuple[str, ...] | None:
    """The ``on:`` events (in the flow's order) an instance ``row`` (with ``state``,
    ``status``, ``due_at``, ``running_attempt``) waits for, when it is runnable in an
    external state of ``flow`` (its version) with nothing due: ``("release",
    "discard")``; ``None`` otherwise (also when ``flow`` is ``None`` or lacks the state)."""
    if flow is None or row["status"] != "runnable" or row["due_at"] is not None:
        return None
    if row.get("running_attempt") is not None:
        return None
    state = flow.states.get(row["state"])
    if state is None or state.kind != "external":
        return None
    return tuple(state.on)


def webhook_what(payload: dict[str, Any]) -> str | None:
    """A webhook event's body as compact JSON (``webhook {"ref": "main"}``), ``None`` for
    another kind's payload. As stored: the caller shows it literally."""
    if set(payload) != {"body", "headers"}:
        return None
    body = json.dumps(payload["body"], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return f"webhook {body}"


def event_what(payload: Any) -> str:
    """What happened, in one text, from a stored event's ``payload``: a tail sensor's
    ``line``, a files sensor's file (``a.csv (12 bytes) in /srv/inbox``), a clock sensor's
    ``tick`` at ``scheduled`` (and how many ticks it missed), a lifecycle event's instance,
    flow, state, kind and error; any other payload as compact
    JSON. As stored: the caller shows it literally."""
    if not isinstance(payload, dict):
        return json.dumps(payload)
    hook = webhook_what(payload)
    if hook is not None:
        return hook
    if isinstance(payload.get("kind"), str) and isinstance(payload.get("instance"), int):
        error = f": {payload['error']}" if payload.get("error") else ""  # a lifecycle event
        return (
            f"instance {payload['instance']} ({payload.get('flow')}, {payload.get('state')}) "
            f"{payload['kind']}{error}"
        )
    if isinstance(payload.get("line"), str):
        return payload["line"]
    if isinstance(payload.get("path"), str):  # the file's name first: it survives a cut
        path, name, size = payload["path"], payload.get("name"), payload.get("size")
        text = name if isinstance(name, str) and name else path
        text += f" ({size} bytes)" if isinstance(size, int) else ""
        if text.startswith(path):
            return text
        folder = path
        if isinstance(name, str) and path.endswith(name):
            folder = path[: -len(name)].rstrip("/")
        return f"{text} in {folder}"
    if "tick" in payload:
        text = f"tick {payload['tick']}"
        if payload.get("scheduled"):
            text += f" scheduled {payload['scheduled']}"
        if payload.get("missed"):
            text += f", {payload['missed']} missed"
        return text
    return json.dumps(payload, sort_keys=True)
