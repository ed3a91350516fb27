"""The rows the worker's hot path passes around, and its precompiled statements.

``Claim`` (an instance claimed with its attempt running) and ``Outcome`` (what a finished
attempt writes) are shared by the claim side (``runner.store.leases``) and the commit side
(``runner.store.commit``); ``hot_for(conn)`` gives the statements both run thousands of times a
second, compiled once per engine (``prepared.Prepared``).

An attempt's row is written once, when the attempt ends (``Hot.close_attempts``). While it
runs, the instance row says so: ``running_attempt`` (its number), ``locked_by`` (its
worker) and ``state_attempted`` (when it started); a checkpoint writes the row early, still
open (``outcome`` NULL), and the end completes it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Integer,
    String,
    and_,
    any_,
    bindparam,
    column,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
    values,
)
from sqlalchemy.sql.elements import ColumnClause

from runner.store.clock import clock_of
from runner.store.db import STATEMENT_TIMEOUT
from runner.store.dialect import dialect_of
from runner.store.prepared import Prepared
from runner.store.tables import JSONType, attempts, instances

#: Statuses a claim may pick up (``sleeping`` ones wake once due).
CLAIMABLE = ("runnable", "sleeping")

#: Every priority, highest first (``priority IN (...)``: one range of
#: ``ix_instances_claim`` per priority, read in the claim's order).
PRIORITIES = tuple(range(9, 0, -1))

#: The columns a claim reads back (``RETURNING``), in this order.
CLAIM_COLS = (
    instances.c.id,
    instances.c.flow,
    instances.c.version,
    instances.c.state,
    instances.c.data,
    instances.c.fence,
    instances.c.attempts,
    instances.c.errors,
    instances.c.restarts,
    instances.c.state_errors,
    instances.c.state_restarts,
    instances.c.event_id,
    instances.c.status,
    instances.c.pool,  # the seat last held (``runner.store.pools.settle``)
    instances.c.due_at,
    instances.c.priority,
    instances.c.start_priority,
    instances.c.limit_key,  # its flow limit (``runner.store.flow_limits``)
    instances.c.runs_on,  # its state's requirement (``runner.labels``)
    instances.c.route_event,  # the starting event's fields its runs_on may name
)

#: Where ``limit_key`` is in a claim row (:data:`CLAIM_COLS`).
LIMIT_KEY_AT = [c.name for c in CLAIM_COLS].index("limit_key")


def due_clause(at, statuses: tuple[str, ...] = CLAIMABLE, *, keys=None):
    """Due and unlocked at ``at`` (epoch seconds, or a bind parameter): what a claim takes
    (of ``statuses``, by default every claimable one; or, with ``keys``, of the status
    and priority those two columns name).

    The statuses are literals, so the clause compiles to one fixed SQL string.
    """
    if keys is None:
        keyed = and_(
            instances.c.status.in_([literal_column(f"'{s}'") for s in statuses]),
            # every priority named: ``ix_instances_claim`` (status, priority DESC,
            # due_at) is read as one range of due rows per priority, never every row
            instances.c.priority.in_([literal_column(str(p)) for p in PRIORITIES]),
        )
    else:
        keyed = and_(instances.c.status == keys[0], instances.c.priority == keys[1])
    return and_(
        keyed,
        instances.c.due_at <= at,
        or_(instances.c.locked_until.is_(None), instances.c.locked_until < at),
        # an attempt a dead worker left running is recorded ``lost`` first
        # (``store.recover_lost``); only then is its instance claimable again
        instances.c.running_attempt.is_(None),
    )


@dataclass
class Claim:
    """One claimed instance with the attempt just started for it (``attempt`` is 1-based;
    ``started_at`` in epoch seconds)."""

    id: int
    flow: str
    version: str
    state: str
    data: dict[str, Any]
    fence: int
    attempt: int
    errors: int
    restarts: int
    state_errors: list[float]
    state_restarts: int
    event_id: int | None
    started_at: float = 0.0
    chain: int = 0  # moves made since this instance was last claimed from the table
    pool: str | None = None  # the pool whose slots the attempt holds (``store.pools``)
    pool_slots: int = 0
    pool_rated: bool = False  # its pool has a rate: never chained into the same pool
    limit: str | None = None  # the flow limit it holds (``store.flow_limits``)
    priority: int = 5  # the row's (1..9)
    pinned: bool = False  # ``flowrun start --priority`` gave it: no state changes it
    runs_on: str | None = None  # its state's requirement (``runner.labels.canonical``)
    route_event: dict[str, Any] | None = None  # the event fields its runs_on may name

    def keeps_route(self, values: dict[str, Any]) -> bool:
        """An outcome's ``values`` leave the row's ``runs_on`` as it is (no move, or a
        move to the same requirement): a chained attempt need not write it, and this
        worker, which matched it, may run it."""
        return "runs_on" not in values or values["runs_on"] == self.runs_on

    def keeps_priority(self, priority: int | None) -> bool:
        """Entering a state of ``priority`` (``None``: no move) leaves the row's as it is
        (so a chained attempt need not write it)."""
        return priority is None or self.pinned or priority == self.priority


@dataclass
class Outcome:
    """What one finished attempt does to its instance and attempt rows.

    ``values`` holds the instance columns to write (the worker computes them from the
    flow's policy); ``attempt_values`` the attempt columns (outcome, to_state, error,
    checkpoint). ``values`` is ignored when the fence no longer matches. ``claim`` is the
    claim the attempt ran under (its state, fence and start go into the attempt row).
    """

    claim: Claim
    values: dict[str, Any]
    attempt_values: dict[str, Any]
    chain: bool = False  # keep the lease and start the next attempt at once
    unchanged: tuple[str, ...] = ()  # JSON columns equal to the stored value: not rewritten
    #: its commit gave up the claim's pool seat in the same ``UPDATE`` (``Hot.commit_pooled``;
    #: on PostgreSQL ``batch.commit_statement``):
    #: ``pools.release`` has no seat of it to clear (only its waiters to wake)
    seat_freed: bool = False

    @property
    def instance_id(self) -> int:
        """The instance's id."""
        return self.claim.id

    @property
    def attempt(self) -> int:
        """The attempt's 1-based number."""
        return self.claim.attempt

    @property
    def fence(self) -> int:
        """The fence the attempt was claimed under."""
        return self.claim.fence


def next_claim(o: Outcome, at: float) -> Claim:
    """The claim of the attempt that continues ``o`` (a chained outcome) at ``at`` (epoch
    s): the same instance, lease and fence, the next attempt number, the outcome's values."""
    prev, v = o.claim, o.values
    assert v["status"] == "runnable", "only a runnable outcome keeps its lock"
    return Claim(
        id=prev.id,
        flow=prev.flow,
        version=prev.version,
        state=v["state"],
        data=v["data"],
        fence=prev.fence,
        attempt=prev.attempt + 1,
        errors=v["errors"],
        restarts=v["restarts"],
        state_errors=list(v["state_errors"]),
        state_restarts=v["state_restarts"],
        event_id=prev.event_id,
        started_at=at,
        chain=prev.chain + 1,
        pool=prev.pool,  # chained only into a state holding the same slots
        pool_slots=prev.pool_slots,
        pool_rated=prev.pool_rated,
        priority=prev.priority,  # chained only where it stays (``Claim.keeps_priority``)
        pinned=prev.pinned,
        limit=prev.limit,  # the same flow: its limit is kept
        runs_on=prev.runs_on,  # chained only where it stays (``Claim.keeps_route``)
        route_event=prev.route_event,
    )


COMMIT_KEYS = (
    "state",
    "status",
    "data",
    "due_at",
    "errors",
    "restarts",
    "state_errors",
    "state_restarts",
    "last_error",
    "state_changed",
    "priority",
)
KEEP_IF_NONE = ("state_changed", "data", "state_errors", "priority")
#: Outcome columns in an index (``ix_instances_claim``, ``ix_instances_flow_status``).
INDEXED = ("status", "due_at", "priority")


class Hot:
    """The worker's hot statements, compiled once per engine (see ``prepared.Prepared``), and
    the engine's ``Dialect`` (``dialect``), resolved once for the claim and commit path."""

    def __init__(self, engine: Engine):
        self.dialect = d = dialect_of(engine)
        self.json = d.json_adapter()
        self.load_json = d.json_loader()
        at = bindparam("at", type_=Float())
        #: claim up to ``n`` due instances (params: at, n, w, until, labels)
        self.claim = Prepared(engine, claim_statement(engine, at))
        #: a claimed ``sleeping`` instance runs: it is ``runnable`` again (param: ids)
        self.wake = Prepared(
            engine,
            update(instances)
            .where(d.ids_in(instances.c.id))
            .values(status=literal_column("'runnable'")),
        )
        #: the fences of the given instances this worker still holds (params: ids, w)
        fences = select(instances.c.id, instances.c.fence).where(
            d.ids_in(instances.c.id), instances.c.locked_by == bindparam("w")
        )
        if d.skip_locked:
            fences = fences.with_for_update()
        self.fences = Prepared(engine, fences)
        fenced = (
            instances.c.id == bindparam("b_id"),
            instances.c.locked_by == bindparam("b_worker"),
            instances.c.fence == bindparam("b_fence"),
        )
        outcome_cols = {
            **{k: bindparam(k) for k in COMMIT_KEYS if k not in KEEP_IF_NONE + INDEXED},
            # None keeps the stored value: unchanged JSON is not rewritten
            "state_changed": func.coalesce(
                bindparam("state_changed", type_=Float()), instances.c.state_changed
            ),
            "data": func.coalesce(bindparam("data", type_=JSONType), instances.c.data),
            "state_errors": func.coalesce(
                bindparam("state_errors", type_=JSONType), instances.c.state_errors
            ),
            "attempts": bindparam("b_attempts"),
            "updated_at": bindparam("b_at"),
        }
        released = {
            **outcome_cols,
            "status": bindparam("status"),
            "due_at": bindparam("due_at", type_=Float()),
            # a move's state priority, unless the start gave one; None keeps it
            "priority": func.coalesce(
                instances.c.start_priority,
                bindparam("priority", type_=Integer()),
                instances.c.priority,
            ),
            "locked_by": null(),
            "locked_until": null(),
            "running_attempt": null(),
        }
        #: an outcome that releases its instance (params: COMMIT_KEYS and b_*); its
        #: ``runs_on`` is not named (indexed: ``ix_instances_runs_on``), so work without
        #: routing writes what it wrote before labels existed
        self.commit_instances = Prepared(engine, update(instances).where(*fenced).values(released))
        #: the same for an attempt that held a pool's seat: the seat goes with the lock
        #: (``pool`` is indexed, so only these rows name it; ``pools.release`` then finds
        #: nothing left to clear)
        self.commit_pooled = Prepared(
            engine,
            update(instances)
            .where(*fenced)
            .values({**released, "pool": null(), "pool_slots": null()}),
        )
        #: the same for a move to another requirement (``runner.labels``; params: also
        #: runs_on, the stored text, '' for none)
        self.commit_routed = Prepared(
            engine,
            update(instances)
            .where(*fenced)
            .values({**released, "runs_on": func.nullif(bindparam("runs_on", type_=String()), "")}),
        )
        #: an outcome whose instance this worker keeps for its next attempt (chained): it
        #: stays runnable and locked, so no indexed column is written (measured on SQLite:
        #: 4 us a row against 9 us when the claim and lock indexes are rewritten); its
        #: ``due_at`` keeps the past value it was claimed at, which is what a claim after
        #: an expired lease needs (params: COMMIT_KEYS but status and due_at, and b_*)
        self.commit_chained = Prepared(
            engine,
            update(instances)
            .where(*fenced)
            .values(
                {
                    **outcome_cols,
                    "locked_until": bindparam("b_until", type_=Float()),
                    "running_attempt": bindparam("b_next"),
                    "state_attempted": bindparam("b_at"),
                }
            ),
        )
        #: record finished attempts, one row each (params: see :func:`attempt_row`)
        self.close_attempts = Prepared(engine, close_attempts(engine))
        #: the database's clock as this process reads it (``runner.store.clock``)
        self.clock = clock_of(engine)
        #: PostgreSQL: the rest of the transaction plans index scans only and cancels
        #: a statement past ``db.STATEMENT_TIMEOUT``, and the server's clock is read in
        #: the same round trip (no params; the clock is the last column)
        self.by_index = None
        if d.skip_locked:
            ms = str(int(STATEMENT_TIMEOUT * 1000))
            self.by_index = Prepared(
                engine,
                select(
                    func.set_config("enable_seqscan", "off", True),
                    func.set_config("enable_bitmapscan", "off", True),
                    func.set_config("statement_timeout", ms, True),
                    literal_column(d.server_clock or "NULL"),
                ),
            )


def claim_statement(engine: Engine, at):
    """The claim: ``UPDATE`` up to ``n`` due instances, highest priority first, then
    oldest due, naming the attempt each starts (``at``: the bind parameter of the current
    time; params at, n, w, until, labels: the worker's labels, ``runner.labels.canonical``),
    only rows whose ``runs_on`` those labels cover (``Dialect.covered``), ``RETURNING``
    :data:`CLAIM_COLS`.

    Each claimable status is read on its own: ``ix_instances_claim (status, priority
    DESC, due_at)`` gives one status's due rows in ``priority DESC, due_at`` order, one
    range per priority (with both statuses in one ``IN`` list neither database can use
    the index's order and reads and sorts every due row). SQLite (one writer at a time)
    picks the rows with ``id IN (SELECT ... FROM (the first n of each status) ORDER BY
    priority DESC, due_at LIMIT n)``, where ``priority IN (9, ..., 1)`` walks the nine
    ranges in order. PostgreSQL 15 cannot keep an index's order across an ``IN`` list on
    a second column, so it reads one range per status and priority: a ``LATERAL``
    subquery over the 18 ``(status, priority)`` pairs (a ``VALUES`` list), each an
    ordered index scan locking its first ``n`` due rows ``FOR UPDATE SKIP LOCKED``, most
    of them empty (one B-tree descent); 18 CTEs instead cost twice the time, in
    planning (measured before priorities: 5 ms a claim with 10,000 queued when sorted,
    against 0.05 ms for an ordered index scan per status; at most ``n`` rows more are
    locked per status and priority present among the due rows). The
    chosen rows are handed over as an array of their ``ctid`` (``= ANY(ARRAY(...))``): the
    update fetches each where the lock found it (a TID scan), where a join to them may
    scan the whole table and ids cost a primary key lookup each (134 buffers read for 64
    rows against 208). A row locked here is not updated by anyone else before this
    statement's update; one updated by another transaction between this statement's
    snapshot and its lock is locked in its newer version, which that snapshot does not
    see: it is left unclaimed this time (the lock ends with the transaction).
    """
    n = bindparam("n", type_=Integer())
    c = instances.c
    d = dialect_of(engine)
    # a state's runs_on (``runner.labels``): only rows the worker's labels cover
    routed = d.covered(c.runs_on)
    if d.skip_locked:
        ctid: ColumnClause[Any] = literal_column("instances.ctid")
        keys = values(column("s", String()), column("p", Integer()), name="k", literal_binds=True)
        keys = keys.data([(status, p) for status in CLAIMABLE for p in PRIORITIES])
        due = (
            select(ctid.label("t"), c.due_at)
            .where(due_clause(at, keys=(keys.c.s, keys.c.p)), routed)
            .order_by(c.due_at)
            .limit(n)
            .with_for_update(skip_locked=True)
            .lateral("due")
        )
        pick = (
            select(due.c.t)
            .select_from(keys)
            .join(due, true())
            .order_by(keys.c.p.desc(), due.c.due_at)
            .limit(n)
            .cte("pick")
        )
        chosen = ctid == any_(func.array(select(pick.c.t).scalar_subquery()))
    else:
        each = [
            select(c.id, c.priority, c.due_at)
            .where(due_clause(at, (status,)), routed)
            .order_by(c.priority.desc(), c.due_at)
            .limit(n)
            .subquery(f"due_{status}")
            for status in CLAIMABLE
        ]
        both = union_all(*(select(x.c.id, x.c.priority, x.c.due_at) for x in each)).subquery()
        inner = select(both.c.id).order_by(both.c.priority.desc(), both.c.due_at)
        chosen = c.id.in_(inner.limit(n).scalar_subquery())
    return (
        update(instances)
        .where(chosen)
        .values(
            # no ``status``: naming an indexed column rewrites its index entries even
            # when the value stays (measured on SQLite: 3.4 us a row against 0.9); the
            # few ``sleeping`` rows claimed are woken by ``Hot.wake``
            locked_by=bindparam("w"),
            locked_until=bindparam("until", type_=Float()),
            fence=instances.c.fence + 1,
            attempts=instances.c.attempts + 1,
            running_attempt=instances.c.attempts + 1,
            state_attempted=at,
            updated_at=at,
        )
        .returning(*CLAIM_COLS)
    )


def close_attempts(engine: Engine):
    """``INSERT`` one finished attempt's row; where a checkpoint already wrote it (still
    open), complete it instead; an attempt already closed (``lost`` by a worker that took
    over, ``cancelled``) is left as it is. Parameters: see :func:`attempt_row`."""
    ins = (
        dialect_of(engine)
        .insert(attempts)
        .values(
            instance_id=bindparam("i"),
            attempt=bindparam("a"),
            state=bindparam("s"),
            worker=bindparam("w"),
            fence=bindparam("f"),
            started_at=bindparam("t", type_=Float()),
            finished_at=bindparam("at", type_=Float()),
            outcome=bindparam("outcome"),
            to_state=bindparam("to_state"),
            error=bindparam("error"),
            checkpoint=bindparam("checkpoint", type_=JSONType),
            log_bytes=bindparam("lb", type_=BigInteger()),
        )
    )
    return completing_open(ins)


def completing_open(ins):
    """``ins`` (an ``INSERT`` into ``attempts`` of SQLite's or PostgreSQL's dialect) with
    ``ON CONFLICT (instance_id, attempt)`` completing a row still open (``outcome`` NULL:
    a checkpoint wrote it) and leaving a closed one as it is. Shared by
    :func:`close_attempts` and the PostgreSQL batch commit (``runner.store.batch``)."""
    x = ins.excluded
    return ins.on_conflict_do_update(
        index_elements=[attempts.c.instance_id, attempts.c.attempt],
        set_={
            "finished_at": x.finished_at,
            "outcome": x.outcome,
            "to_state": x.to_state,
            "error": x.error,
            "checkpoint": func.coalesce(x.checkpoint, attempts.c.checkpoint),
            "log_bytes": x.log_bytes,
        },
        where=attempts.c.outcome.is_(None),
    )


def attempt_row(
    claim: Claim,
    worker_id: str,
    at: float,
    outcome: str,
    to_state: str | None = None,
    error: str | None = None,
    checkpoint=None,
    log_bytes: int | None = None,
) -> dict[str, Any]:
    """The parameters of :attr:`Hot.close_attempts` for ``claim``'s attempt ending at
    ``at`` (epoch seconds); ``checkpoint`` must already be adapted (``Hot.json``);
    ``log_bytes``: what its handler wrote to its attempt log (``None``: not captured)."""
    return {
        "i": claim.id,
        "a": claim.attempt,
        "s": claim.state,
        "w": worker_id,
        "f": claim.fence,
        "t": claim.started_at,
        "at": at,
        "outcome": outcome,
        "to_state": to_state,
        "error": error,
        "checkpoint": checkpoint,
        "lb": log_bytes,
    }


def running_attempt_row(instance, at: float, outcome: str, error: str) -> dict[str, Any]:
    """The parameters of :attr:`Hot.close_attempts` that end the attempt an instance row
    says is running (``lost``, when its worker's lease expired), from that row alone:
    ``instance`` is a mapping of ``instances`` columns with ``running_attempt`` set; its
    ``state_attempted`` is the start (``at``, epoch seconds, when unknown)."""
    started = instance["state_attempted"]
    return {
        "i": instance["id"],
        "a": instance["running_attempt"],
        "s": instance["state"],
        "w": instance["locked_by"] or "?",
        "f": instance["fence"],
        "t": at if started is None else started,
        "at": at,
        "outcome": outcome,
        "to_state": None,
        "error": error,
        "checkpoint": None,
        "lb": None,
    }


_hot: weakref.WeakKeyDictionary[Engine, Hot] = weakref.WeakKeyDictionary()


def hot_for(conn: Connection) -> Hot:
    """The :class:`Hot` statements of ``conn``'s engine (compiled on first use; kept as
    long as the engine lives)."""
    engine = conn.engine
    hot = _hot.get(engine)
    if hot is None:
        hot = _hot[engine] = Hot(engine)
    return hot
