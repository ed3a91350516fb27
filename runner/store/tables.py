"""SQLModel tables: the whole persistent state of flowrun.

Every timestamp column is a float of seconds since the Unix epoch, UTC (``time.time()``).
Floats compare and index identically on SQLite and PostgreSQL, keep the claim query
dialect-free, and are converted to ISO 8601 UTC only at the edges (``--json``, the console).

The instance row carries Stator's lock columns (``locked_by``, ``locked_until``) plus a
``fence`` counter bumped by every claim and every operator command; a worker commits an
outcome only while ``locked_by`` and ``fence`` still match what it claimed (see
``runner.store.leases``). One composite index, ``ix_instances_claim (status, priority
DESC, due_at)``, serves the claim query (source: Takahē ``stator/models.py``: lock
columns + one index).
"""

# No ``from __future__ import annotations`` here: SQLAlchemy and pydantic would evaluate
# every field's annotation string when the classes are made (3 ms of a daemon's start).
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Dialect,
    Index,
    LargeBinary,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.types import TypeDecorator, TypeEngine
from sqlmodel import Field, SQLModel
from sqlmodel._compat import SQLModelConfig

from runner.store.dialect import json_column_type


class JSONOrJSONB(TypeDecorator[Any]):
    """JSON on SQLite, JSONB on PostgreSQL: ``JSON().with_variant(JSONB(), "postgresql")``,
    except that PostgreSQL's types are imported only once a PostgreSQL database is used
    (``runner.store.dialect.json_column_type``: importing them cost a SQLite daemon's
    start-up ~26 ms)."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        """JSONB for PostgreSQL, JSON for any other database."""
        return dialect.type_descriptor(json_column_type(dialect))


#: The type of every JSON column (and of the hot statements' JSON parameters).
JSONType = JSONOrJSONB()

#: Every table's pydantic configuration: its validator and serializer are built on first
#: use instead of when the class is made (``defer_build``). flowrun writes and reads the
#: tables through their SQLAlchemy ``Table`` (Core statements), never through a pydantic
#: validation or dump, so a daemon builds none: 7 ms less to its first claim
#: (``docs/performance.md``, "A light start").
TABLE_CONFIG = SQLModelConfig(defer_build=True)


class Instance(SQLModel, table=True):
    """One run of a flow.

    ``state`` is a node of the flow's graph; ``status`` is the fixed lifecycle.
    ``due_at`` is when the instance is next ready (``None``: waiting for an event in an
    ``external`` state, or not scheduled at all). ``attempts``/``errors``/``restarts`` are
    totals over the instance's life; ``state_errors`` (error timestamps inside the error
    budget window) and ``state_restarts`` belong to the current state and reset when the
    state changes or an operator retries. ``running_attempt`` is the number
    (``attempts.attempt``) of the attempt in progress, ``state_attempted`` when it started
    and ``locked_by`` its worker: the attempt's own row is written when it ends. When the
    lease of a running attempt expires (its worker died), a worker records it as ``lost``
    (``store.recover_lost``) before the instance can be claimed again.
    """

    __tablename__ = "instances"
    model_config = TABLE_CONFIG
    __table_args__ = (
        # ``ix_instances_claim`` and ``ix_instances_waiting`` are made below the class:
        # both order by ``priority DESC``
        # ``id`` too: PostgreSQL reads one flow and status in id order (the pruner)
        Index("ix_instances_flow_status", "flow", "status", "id"),
        Index("ix_instances_locked_by", "locked_by"),
        # partial (only the instances an event started); the migration (0006) makes it
        # partial on PostgreSQL too, where naming ``postgresql_where`` here would load
        # SQLAlchemy's PostgreSQL dialect in every SQLite process
        Index("ix_instances_event", "event_id", sqlite_where=text("event_id IS NOT NULL")),
        # partial (0007 makes them partial on PostgreSQL too): the attempts holding a
        # pool's slots, and the instances waiting for one (``runner.store.pools``)
        Index("ix_instances_pool", "pool", sqlite_where=text("pool IS NOT NULL")),
        # partial (0012 makes it partial on PostgreSQL too): the instances of flows with
        # a ``max_running``, the locked ones last (``runner.store.flow_limits`` counts
        # those running; ``locked_by`` changes no more than it does for its own index)
        Index(
            "ix_instances_limit",
            "limit_key",
            "locked_by",
            sqlite_where=text("limit_key IS NOT NULL"),
        ),
        # partial (0014 makes it partial on PostgreSQL too): the instances with a
        # ``runs_on`` requirement (``runner.store.routing`` looks for those unmatched)
        Index(
            "ix_instances_runs_on", "runs_on", "due_at", sqlite_where=text("runs_on IS NOT NULL")
        ),
        # deadline not yet acted on (``runner.store.deadlines``: the earliest is read)
        Index("ix_instances_deadline", "deadline_at", sqlite_where=text("deadline_at IS NOT NULL")),
    )

    id: int | None = Field(default=None, primary_key=True)
    flow: str = Field(max_length=200)
    version: str = Field(max_length=64, description="content hash of the flow definition")
    state: str = Field(max_length=200)
    status: str = Field(default="runnable", max_length=16)
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSONType, nullable=False))
    due_at: float | None = Field(default=None)
    locked_by: str | None = Field(default=None, max_length=200)
    locked_until: float | None = Field(default=None)
    fence: int = Field(default=0)
    attempts: int = Field(default=0)
    errors: int = Field(default=0)
    restarts: int = Field(default=0)
    state_errors: list[float] = Field(
        default_factory=list, sa_column=Column(JSONType, nullable=False)
    )
    state_restarts: int = Field(default=0)
    running_attempt: int | None = Field(default=None)
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    state_changed: float = Field(default=0.0)
    state_attempted: float | None = Field(default=None)
    created_at: float = Field(default=0.0)
    updated_at: float = Field(default=0.0)
    event_id: int | None = Field(default=None, description="sensor event that started it")
    label: str | None = Field(
        default=None, max_length=200, description="the flow's label template over the data"
    )
    history_from: float | None = Field(
        default=None, description="attempts that ended before this were pruned (live instance)"
    )
    pool: str | None = Field(
        default=None, max_length=200, description="the pool whose slots its attempt holds"
    )
    pool_slots: int | None = Field(default=None, description="how many of them")
    waiting_for: str | None = Field(
        default=None, max_length=200, description="the pool it waits for (not due meanwhile)"
    )
    wait_due: float | None = Field(default=None, description="its due time when it began to wait")
    priority: int = Field(
        default=5,
        sa_type=SmallInteger,
        description="1..9, higher claimed first: the start's, else its state's, else its flow's",
    )
    start_priority: int | None = Field(
        default=None,
        sa_type=SmallInteger,
        description="flowrun start --priority (NULL: none); overrides every state's",
    )
    limit_key: str | None = Field(
        default=None, max_length=200, description="its flow's max_running limit (and key)"
    )
    runs_on: str | None = Field(
        default=None,
        max_length=1000,
        description="its state's runs_on, resolved (runner.labels.canonical; NULL: any worker)",
    )
    route_event: str | None = Field(
        default=None,
        sa_column=Column(Text, nullable=True),
        description="the starting event's fields its flow's runs_on name (JSON; NULL: none)",
    )
    deadline_at: float | None = Field(
        default=None,
        description="its earliest deadline not yet acted on (NULL: none); see store.deadlines",
    )


class Attempt(SQLModel, table=True):
    """One execution of a handler for one instance (every attempt ends as a row).

    The row is written once, when the attempt ends (outcome set), or earlier by its first
    checkpoint (``outcome`` ``None`` until the end completes it); while it runs, the
    instance row describes it (``running_attempt``). An attempt a dead worker left running
    is recorded as ``lost``. ``checkpoint`` is the last data the handler checkpointed
    during this attempt.
    """

    __tablename__ = "attempts"
    model_config = TABLE_CONFIG
    __table_args__ = (
        UniqueConstraint("instance_id", "attempt", name="uq_attempts_instance_attempt"),
    )

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int
    attempt: int = Field(description="1-based number of this attempt within its instance")
    state: str = Field(max_length=200)
    worker: str = Field(max_length=200)
    fence: int = Field(default=0)
    started_at: float
    finished_at: float | None = Field(default=None)
    outcome: str | None = Field(default=None, max_length=16)
    to_state: str | None = Field(default=None, max_length=200)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    checkpoint: dict[str, Any] | None = Field(default=None, sa_column=Column(JSONType))
    log_bytes: int | None = Field(
        default=None,
        sa_type=BigInteger,
        description="bytes the handler wrote to its attempt log, both streams, before the "
        "cap (0: none, and no end row was stored); NULL: not captured (capture off, lost)",
    )


class LogChunk(SQLModel, table=True):
    """A piece of what an attempt's handler wrote (``runner.store.log_writer``).

    ``stream`` is 1 (stdout) or 2 (stderr), or 0 for the row written when the attempt's
    capture ended (empty ``data``; ``offset`` is then the total bytes written); ``offset``
    the position of ``data``'s first byte in the attempt's whole output (both streams,
    in the order read); ``at`` when it was read, epoch seconds UTC. Rows of an attempt
    are ordered by ``seq``. A gap between a row's end and the next row's ``offset`` is
    what the attempt's cap dropped (``runner.store.log_reader``).
    """

    __tablename__ = "attempt_logs"
    model_config = TABLE_CONFIG
    __table_args__ = (Index("ix_attempt_logs_attempt", "instance_id", "attempt", "seq"),)

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int
    attempt: int
    seq: int
    stream: int = Field(sa_type=SmallInteger)
    at: float
    offset: int = Field(sa_type=BigInteger)
    data: bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class Command(SQLModel, table=True):
    """An operator or rule request, stored as data (after rq's ``command.py``).

    ``command`` is one of pause, resume, kill, retry, send (``args`` holds ``{"event": ...}``
    for send). ``status`` is ``applied`` or ``refused``; ``result`` is the message shown
    to the operator (for a refusal, e.g. "cannot resume: instance 42 is completed").
    """

    __tablename__ = "commands"
    model_config = TABLE_CONFIG
    __table_args__ = (Index("ix_commands_instance", "instance_id"),)

    id: int | None = Field(default=None, primary_key=True)
    instance_id: int
    command: str = Field(max_length=16)
    args: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSONType, nullable=False))
    source: str = Field(default="cli", max_length=200)
    created_at: float
    status: str = Field(default="applied", max_length=16)
    result: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class Event(SQLModel, table=True):
    """A sensor event, written before any rule acts on it.

    ``(sensor, key)`` is unique, so a file or log line is recorded once however many
    daemons see it. ``handled_at`` is set in the same transaction as the rule's action;
    ``action`` says what the rules did ("started instance 42", "no rule matched", ...).
    ``sensor`` is ``"<flow>.<sensor name>"``.
    """

    __tablename__ = "events"
    model_config = TABLE_CONFIG
    __table_args__ = (
        UniqueConstraint("sensor", "key", name="uq_events_sensor_key"),
        Index("ix_events_pending", "handled_at", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    sensor: str = Field(max_length=400)
    key: str = Field(max_length=1000)
    payload: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column(JSONType, nullable=False)
    )
    created_at: float
    handled_at: float | None = Field(default=None)
    action: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class Delivery(SQLModel, table=True):
    """One notification a rule's ``exec`` or ``webhook`` owes for one event.

    Written in the rule's transaction (with the event's ``handled_at``), then delivered by
    any daemon (``runner.sensors.deliver``): claimed with a lease (``locked_by``,
    ``locked_until``), so one that died mid-delivery is delivered again by another (at
    least once). ``status``: ``pending`` (``due_at`` is the next try), ``delivered``
    (``delivered_at``) or ``failed`` (``retry_for`` passed). ``target`` is what to do:
    ``{"exec": argv}`` or ``{"webhook": {url, method, headers (templates; ``{env.X}`` read
    when sent, never stored), body, timeout}}``. ``once_key``: the ``once_per`` key;
    ``suppressed``: the events folded into this delivery (not delivered themselves);
    ``folded_before``: how many its key folded since the key's previous delivery.
    """

    __tablename__ = "deliveries"
    model_config = TABLE_CONFIG
    __table_args__ = (
        Index("ix_deliveries_due", "status", "due_at"),
        Index("ix_deliveries_event", "event_id"),
        Index("ix_deliveries_once", "rule", "once_key", "created_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    event_id: int
    rule: str = Field(max_length=400, description="rule:<flow>#<n>")
    target: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSONType, nullable=False))
    status: str = Field(default="pending", max_length=16)
    created_at: float
    due_at: float | None = Field(default=None)
    give_up_at: float
    attempts: int = Field(default=0)
    last_result: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    delivered_at: float | None = Field(default=None)
    once_key: str | None = Field(default=None, max_length=1000)
    suppressed: int = Field(default=0)
    folded_before: int = Field(default=0)
    locked_by: str | None = Field(default=None, max_length=200)
    locked_until: float | None = Field(default=None)


class SensorLease(SQLModel, table=True):
    """Durable cursor and lease of one sensor (``"<flow>.<sensor name>"``).

    ``cursor`` is sensor-specific JSON (a tail's inode and byte offset, a clock's last
    tick). ``locked_by``/``locked_until`` make a sensor run in one daemon at a time.
    """

    __tablename__ = "sensors"
    model_config = TABLE_CONFIG

    name: str = Field(primary_key=True, max_length=400)
    cursor: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSONType, nullable=False))
    locked_by: str | None = Field(default=None, max_length=200)
    locked_until: float | None = Field(default=None)
    updated_at: float = Field(default=0.0)


class WorkerRow(SQLModel, table=True):
    """A running worker (daemon or console-embedded) and its heartbeat."""

    __tablename__ = "workers"
    model_config = TABLE_CONFIG

    id: str = Field(primary_key=True, max_length=200)
    host: str = Field(max_length=255)
    pid: int
    started_at: float
    heartbeat_at: float
    running: int = Field(default=0, description="attempts running at the last heartbeat")
    stopped_at: float | None = Field(default=None)
    heartbeat_every: float | None = Field(
        default=None, description="seconds between its heartbeats (NULL: written before 0004)"
    )
    boot_id: str | None = Field(
        default=None,
        max_length=120,
        description="its kernel's boot id and pid namespace (runner.store.host; NULL: unknown)",
    )
    pid_started: int | None = Field(
        default=None,
        sa_type=BigInteger,
        description="its process's start time, clock ticks since boot (NULL: unknown)",
    )
    labels: str | None = Field(
        default=None,
        sa_column=Column(Text, nullable=True),
        description="its labels (runner.labels.canonical JSON; NULL: written before 0014)",
    )


class FlowVersion(SQLModel, table=True):
    """A flow definition as loaded, keyed by content hash.

    Running instances keep the version they started with; any worker on any host can
    recompile it from ``source``.
    """

    __tablename__ = "flow_versions"
    model_config = TABLE_CONFIG

    version: str = Field(primary_key=True, max_length=64)
    flow: str = Field(max_length=200)
    path: str = Field(sa_column=Column(Text, nullable=False))
    source: str = Field(sa_column=Column(Text, nullable=False))
    loaded_at: float


class PoolRow(SQLModel, table=True):
    """A pool of slots shared by every daemon (``runner.store.pools``).

    ``declared`` is the number the flow files give (the last recorded), ``slots`` the
    operator's run-time number (``flowrun pool set``; ``NULL``: the declared one). A claim
    of a pooled state locks this row (PostgreSQL) while it counts the slots in use. A
    ``rate`` (``10/1m``) keeps its latest ``starts``; a state's own rate has a row named
    ``<flow>.<state>`` with a rate and no slots.
    """

    __tablename__ = "pools"
    model_config = TABLE_CONFIG

    name: str = Field(primary_key=True, max_length=200)
    declared: int | None = Field(default=None)
    slots: int | None = Field(default=None, description="set by an operator; NULL: declared")
    updated_at: float = Field(default=0.0)
    rate: str | None = Field(
        default=None, max_length=40, description="at most COUNT starts per DURATION: 10/1m"
    )
    starts: list[float] | None = Field(
        default=None,
        sa_column=Column(JSONType, nullable=True),
        description="the latest starts (epoch s) within the rate's window",
    )


def _table(model: type[SQLModel]) -> Table:
    """The SQLAlchemy ``Table`` SQLModel made of ``model`` (``table=True``)."""
    return model.__table__  # type: ignore[attr-defined]  # set by the declarative base


instances = _table(Instance)
attempts = _table(Attempt)
commands = _table(Command)
attempt_logs = _table(LogChunk)
events = _table(Event)
deliveries = _table(Delivery)
sensors = _table(SensorLease)
workers = _table(WorkerRow)
flow_versions = _table(FlowVersion)
pools = _table(PoolRow)

# priority descending: one status, ``priority IN (9, ..., 1)`` and ``ORDER BY priority
# DESC, due_at`` are read in index order, one range of due rows per priority
# (``runner.store.hot.claim_statement``); a pool's waiters the same way
# (``runner.store.pool_statements``); partial on PostgreSQL too (migrations 0007, 0011)
Index("ix_instances_claim", instances.c.status, instances.c.priority.desc(), instances.c.due_at)
Index(
    "ix_instances_waiting",
    instances.c.waiting_for,
    instances.c.priority.desc(),
    instances.c.wait_due,
    sqlite_where=text("waiting_for IS NOT NULL"),
)
metadata = SQLModel.metadata
