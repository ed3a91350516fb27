"""One instance as stored, shared by the CLI and the console: ``flowrun show`` (text and
``--json``), the console's detail screen and ``flowrun explain``'s rows.

Each query is SQL text run through a ``runner.store.reader.Reader`` (stdlib ``sqlite3``
for the CLI on a SQLite file, SQLAlchemy otherwise); every function takes a ``Reader`` or
an ``Engine``, and reads one instance in one snapshot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.labels import decode, match
from runner.ops.pools import pool_of
from runner.ops.views import attempt_json, instance_json, iso, waits_for
from runner.store.reader import (
    ATTEMPT_COLUMNS,
    COMMAND_COLUMNS,
    EVENT_COLUMNS,
    INSTANCE_COLUMNS,
    EngineOrReader,
    Reader,
    as_dicts,
    columns,
    reader_of,
)

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.facts import FlowFacts


def with_running(row: Any, history: list[Any]) -> list[dict[str, Any]]:
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


@dataclass
class InstanceRecord:
    """One instance as stored: what ``flowrun show`` and the console's detail screen read.

    Attributes:
        row: its ``instances`` row (column name to value; times in epoch seconds).
        attempts: its newest attempt rows, newest first, the running attempt in front
            (:func:`with_running`).
        commands: its newest command rows, newest first.
    """

    row: dict[str, Any]
    attempts: list[dict[str, Any]]
    commands: list[dict[str, Any]]


def read_instance(
    db: EngineOrReader,
    instance_id: int,
    *,
    history: int | None = 500,
    commands_limit: int | None = None,
) -> InstanceRecord | None:
    """One instance with its last ``history`` attempts and its last ``commands_limit``
    commands (all when ``None``), read in one snapshot; ``None`` when unknown. ``db`` is a
    ``Reader`` or an ``Engine``.

    Raises:
        sqlite3.Error, sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    reader = reader_of(db)
    params: dict[str, Any] = {"id": instance_id}
    att_sql = (
        f"SELECT {columns(ATTEMPT_COLUMNS)} FROM attempts WHERE instance_id = :id"
        " ORDER BY attempt DESC"
    )
    if history is not None:
        att_sql += " LIMIT :history"
        params["history"] = history
    cmd_sql = f"SELECT {columns(COMMAND_COLUMNS)} FROM commands WHERE instance_id = :id"
    cmd_sql += " ORDER BY id DESC"
    if commands_limit is not None:
        cmd_sql += " LIMIT :commands"
        params["commands"] = commands_limit
    with reader.snapshot() as run:
        found = run(f"SELECT {columns(INSTANCE_COLUMNS)} FROM instances WHERE id = :id", params)
        if not found:
            return None
        att = run(att_sql, params)
        cmds = run(cmd_sql, params)
        found_workers = run(WORKERS_SQL, {}) if found[0][INSTANCE_COLUMNS.index("runs_on")] else []
    row = as_dicts(reader, INSTANCE_COLUMNS, found)[0]
    if row["runs_on"]:  # the workers its requirement matches, as they are now
        m = match(found_workers, decode(row["runs_on"]), time.time())
        row["route_now"] = {"alive": m.alive, "last": m.last}
    if row["waiting_for"] and row["due_at"] is None:  # the pool it waits for, as it is now
        row["pool_now"] = pool_of(reader, row["waiting_for"])
    history_rows = with_running(row, as_dicts(reader, ATTEMPT_COLUMNS, att))
    return InstanceRecord(row, history_rows[:history], as_dicts(reader, COMMAND_COLUMNS, cmds))


#: The workers' rows :func:`runner.store.routing.match` reads.
WORKERS_SQL = "SELECT labels, heartbeat_at, heartbeat_every, stopped_at FROM workers"


def get_instance(
    db: EngineOrReader, instance_id: int, *, history_limit: int = 500
) -> dict[str, Any] | None:
    """One instance (``instance_json``) with ``history`` (its attempts, oldest first,
    the last ``history_limit``), ``checkpoints``, ``commands`` (oldest first) and
    ``budget`` (the error budget of its current state, ``None`` in a terminal state or
    when its flow version no longer compiles) and ``waits_for`` (the ``on:`` events it
    waits for, runnable in an external state with nothing due; else ``None``),
    ``deadline_at`` (ISO 8601 UTC: its next deadline not acted on yet, else ``None``);
    ``None`` when unknown. ``db`` is a
    ``Reader`` or an ``Engine``: ``flowrun show --json``.

    Raises:
        sqlite3.Error, sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    reader = reader_of(db)
    rec = read_instance(reader, instance_id, history=history_limit)
    if rec is None:
        return None
    row, att = rec.row, rec.attempts
    out = instance_json(row)
    out["state_error_times"] = [iso(t) for t in row["state_errors"] or []]
    out["budget"] = _budget(reader, row)
    out["history_pruned_before"] = iso(row["history_from"])
    out["waits_for"] = _waits_for(reader, row)
    out["deadline_at"] = iso(row["deadline_at"])  # its next deadline not acted on, or None
    out["history"] = [attempt_json(a) for a in reversed(att)]
    setups = _setups(reader, row["version"])
    for item in out["history"]:  # the names its handler got, never a secret's value
        item["env"], item["secrets"] = setups.get(item["state"], ((), ()))
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
        for c in reversed(rec.commands)
    ]
    return out


def stored_flow(db: EngineOrReader, version: str, *, imports: bool = True) -> CompiledFlow:
    """The ``CompiledFlow`` of a stored ``version`` (``runner.store.versions``' cache),
    its source read through the read side; ``db`` a ``Reader`` or an ``Engine``;
    ``imports=False``: its ``call`` modules not imported (``compile_stored``).

    Raises:
        UserError: the version is not stored or no longer compiles (exit 2).
    """
    from runner.store.versions import compile_stored

    reader = reader_of(db)

    def source() -> tuple[str, str] | None:
        with reader.snapshot() as run:
            rows = run("SELECT source, path FROM flow_versions WHERE version = :v", {"v": version})
        return (rows[0][0], rows[0][1]) if rows else None

    return compile_stored(version, source, imports=imports)


def stored_facts(db: EngineOrReader, version: str) -> FlowFacts:
    """The ``FlowFacts`` of a stored ``version`` (``runner.flowspec.facts``' disk cache;
    compiled through :func:`stored_flow` on a miss, importing no ``call`` module): what
    ``show``, ``explain`` and ``ls`` read of a flow, without the compiler when cached.

    Raises:
        UserError: the version is not stored or no longer compiles (exit 2).
    """
    from runner.flowspec.facts import cached_facts

    return cached_facts(version, lambda: stored_flow(db, version, imports=False))


def _setups(reader: Reader, version: str) -> dict[str, tuple[list[str], list[str]]]:
    """``{state: (env names, secret names)}`` of a stored flow version's handler states
    (``{}`` when it no longer compiles): what ``show`` lists for each attempt."""
    from runner.errors import UserError

    try:
        states = stored_facts(reader, version).states
    except UserError:
        return {}
    return {
        name: (list(st.setup.env_names), list(st.setup.secret_names))
        for name, st in states.items()
        if st.kind in ("exec", "call")
    }


def _waits_for(reader: Reader, row: Any) -> list[str] | None:
    """The ``on:`` events the instance waits for in an external state
    (``runner.ops.views.waits_for``); ``None`` when it waits for none or its flow version
    no longer compiles."""
    from runner.errors import UserError

    try:
        flow = stored_facts(reader, row["version"])
    except UserError:
        return None
    events = waits_for(row, flow)
    return None if events is None else list(events)


def _budget(reader: Reader, row: Any) -> dict[str, Any] | None:
    """The error budget of the instance's current state, from the stored error
    timestamps; ``None`` in a terminal state (nothing runs there, so it has no budget to
    spend) and when its flow version no longer compiles."""
    from runner import lifecycle
    from runner.errors import UserError

    try:
        state = stored_facts(reader, row["version"]).states[row["state"]]
    except (UserError, KeyError):
        return None
    if state.kind == "terminal":
        return None
    return lifecycle.budget(row["state_errors"], time.time(), state.policy, row["state_restarts"])


def instance_rows(db: EngineOrReader, instance_id: int) -> dict[str, Any] | None:
    """The raw rows behind one instance, for reasoning over its history (``runner.ops.explain``).

    Returns ``None`` for an unknown id, else ``{"instance": {...}, "attempts": [...],
    "commands": [...], "event": {...} | None}``: plain dicts of the table columns with
    float epoch seconds (no ISO conversion), attempts oldest first with the attempt
    running now (from the instance row, ``outcome`` ``None``) last, commands in the order
    they were written, and the sensor event that started the instance, if any. ``db`` is
    a ``Reader`` or an ``Engine``.
    """
    reader = reader_of(db)
    rec = read_instance(reader, instance_id, history=None)
    if rec is None:
        return None
    event = None
    if rec.row["event_id"] is not None:
        with reader.snapshot() as run:
            found = run(
                f"SELECT {columns(EVENT_COLUMNS)} FROM events WHERE id = :id",
                {"id": rec.row["event_id"]},
            )
        event = as_dicts(reader, EVENT_COLUMNS, found)[0] if found else None
    return {
        "instance": rec.row,
        "attempts": [dict(a) for a in reversed(rec.attempts)],
        "commands": list(reversed(rec.commands)),
        "event": event,
    }
