"""The tables: the whole persistent state of flowrun (SQLAlchemy Core).

Every timestamp column is a float of seconds since the Unix epoch, UTC (``time.time()``).
Floats compare and index identically on SQLite and PostgreSQL, keep the claim query
dialect-free, and are converted to ISO 8601 UTC only at the edges (``--json``, the console).

The instance row carries Stator's lock columns (``locked_by``, ``locked_until``) plus a
``fence`` counter bumped by every claim and every operator command; a worker commits an
outcome only while ``locked_by`` and ``fence`` still match what it claimed (see
``runner.store.leases``). One composite index, ``ix_instances_claim (status, due_at)``, serves the
claim query (source: Takahē ``stator/models.py``: lock columns + one index).

The tables were SQLModel classes; only their ``__table__`` was ever used, and SQLModel
brought pydantic and SQLAlchemy's ORM into every command's start-up (about half of what
``flowrun ls`` imported). Plain ``Table`` objects describe the same schema, with
Python-side ``default`` values where the models had them (``tests/unit/test_migrations.py``
compares the database the migrations make with them).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

#: JSON on SQLite, JSONB on PostgreSQL.
JSONType = JSON().with_variant(JSONB(), "postgresql")

#: Every table of flowrun (what the migrations test compares the database with).
metadata = MetaData()

#: One run of a flow.
#:
#: ``state`` is a node of the flow's graph; ``status`` is the fixed lifecycle.
#: ``due_at`` is when the instance is next ready (``None``: waiting for an event in an
#: ``external`` state, or not scheduled at all). ``attempts``/``errors``/``restarts`` are
#: totals over the instance's life; ``state_errors`` (error timestamps inside the error
#: budget window) and ``state_restarts`` belong to the current state and reset when the
#: state changes or an operator retries. ``running_attempt`` is the number
#: (``attempts.attempt``) of the attempt in progress, ``state_attempted`` when it started
#: and ``locked_by`` its worker: the attempt's own row is written when it ends. When the
#: lease of a running attempt expires (its worker died), a worker records it as ``lost``
#: (``store.recover_lost``) before the instance can be claimed again.
instances = Table(
    "instances",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("flow", String(200), nullable=False),
    Column("version", String(64), nullable=False),  # content hash of the flow definition
    Column("state", String(200), nullable=False),
    Column("status", String(16), nullable=False, default="runnable"),
    Column("data", JSONType, nullable=False),
    Column("due_at", Float, nullable=True),
    Column("locked_by", String(200), nullable=True),
    Column("locked_until", Float, nullable=True),
    Column("fence", Integer, nullable=False, default=0),
    Column("attempts", Integer, nullable=False, default=0),
    Column("errors", Integer, nullable=False, default=0),
    Column("restarts", Integer, nullable=False, default=0),
    Column("state_errors", JSONType, nullable=False),
    Column("state_restarts", Integer, nullable=False, default=0),
    Column("running_attempt", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("state_changed", Float, nullable=False, default=0.0),
    Column("state_attempted", Float, nullable=True),
    Column("created_at", Float, nullable=False, default=0.0),
    Column("updated_at", Float, nullable=False, default=0.0),
    Column("event_id", Integer, nullable=True),  # the sensor event that started it
    Column("label", String(200), nullable=True),  # the flow's label template over the data
    Index("ix_instances_claim", "status", "due_at"),
    Index("ix_instances_flow_status", "flow", "status"),
    Index("ix_instances_locked_by", "locked_by"),
)

#: One execution of a handler for one instance (every attempt ends as a row).
#:
#: The row is written once, when the attempt ends (outcome set), or earlier by its first
#: checkpoint (``outcome`` ``None`` until the end completes it); while it runs, the
#: instance row describes it (``running_attempt``). An attempt a dead worker left running
#: is recorded as ``lost``. ``checkpoint`` is the last data the handler checkpointed
#: during this attempt.
attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("instance_id", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),  # 1-based, within its instance
    Column("state", String(200), nullable=False),
    Column("worker", String(200), nullable=False),
    Column("fence", Integer, nullable=False, default=0),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    Column("outcome", String(16), nullable=True),
    Column("to_state", String(200), nullable=True),
    Column("error", Text, nullable=True),
    Column("checkpoint", JSONType, nullable=True),
    UniqueConstraint("instance_id", "attempt", name="uq_attempts_instance_attempt"),
)

#: An operator or rule request, stored as data (after rq's ``command.py``).
#:
#: ``command`` is one of pause, resume, kill, retry, send (``args`` holds ``{"event": ...}``
#: for send). ``status`` is ``applied`` or ``refused``; ``result`` is the message shown
#: to the operator (for a refusal, e.g. "cannot resume: instance 42 is completed").
commands = Table(
    "commands",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("instance_id", Integer, nullable=False),
    Column("command", String(16), nullable=False),
    Column("args", JSONType, nullable=False),
    Column("source", String(200), nullable=False, default="cli"),
    Column("created_at", Float, nullable=False),
    Column("status", String(16), nullable=False, default="applied"),
    Column("result", Text, nullable=True),
    Index("ix_commands_instance", "instance_id"),
)

#: A sensor event, written before any rule acts on it.
#:
#: ``(sensor, key)`` is unique, so a file or log line is recorded once however many
#: daemons see it. ``handled_at`` is set in the same transaction as the rule's action;
#: ``action`` says what the rules did ("started instance 42", "no rule matched", ...).
#: ``sensor`` is ``"<flow>.<sensor name>"``.
events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("sensor", String(400), nullable=False),
    Column("key", String(1000), nullable=False),
    Column("payload", JSONType, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("handled_at", Float, nullable=True),
    Column("action", Text, nullable=True),
    UniqueConstraint("sensor", "key", name="uq_events_sensor_key"),
    Index("ix_events_pending", "handled_at", "id"),
)

#: Durable cursor and lease of one sensor (``"<flow>.<sensor name>"``).
#:
#: ``cursor`` is sensor-specific JSON (a tail's inode and byte offset, a clock's last
#: tick). ``locked_by``/``locked_until`` make a sensor run in one daemon at a time.
sensors = Table(
    "sensors",
    metadata,
    Column("name", String(400), primary_key=True),
    Column("cursor", JSONType, nullable=False),
    Column("locked_by", String(200), nullable=True),
    Column("locked_until", Float, nullable=True),
    Column("updated_at", Float, nullable=False, default=0.0),
)

#: A running worker (daemon or console-embedded) and its heartbeat.
workers = Table(
    "workers",
    metadata,
    Column("id", String(200), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("running", Integer, nullable=False, default=0),  # attempts at the last heartbeat
    Column("stopped_at", Float, nullable=True),
)

#: A flow definition as loaded, keyed by content hash.
#:
#: Running instances keep the version they started with; any worker on any host can
#: recompile it from ``source``.
flow_versions = Table(
    "flow_versions",
    metadata,
    Column("version", String(64), primary_key=True),
    Column("flow", String(200), nullable=False),
    Column("path", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("loaded_at", Float, nullable=False),
)
