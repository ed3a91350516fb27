"""The worker's hot statements, compiled once per engine: ``hot_for(conn)`` gives the
:class:`Hot` of ``conn``'s engine (``prepared.Prepared``), the statements the claim side
(``runner.store.leases``) and the commit side (``runner.store.commit``) run thousands of
times a second: the claim (:func:`claim_statement`), the wake of a claimed ``sleeping``
instance, the fences, the outcome commits (released, pooled, routed, chained), the
attempts' rows (:func:`close_attempts`) and, on PostgreSQL, the cycle's ``SET LOCAL``
with the server's clock. The rows they pass around are ``runner.store.rows``'.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Integer,
    String,
    any_,
    bindparam,
    cast,
    column,
    func,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
    values,
)
from sqlalchemy.sql.elements import ColumnClause

from runner.store.clock import clock_of
from runner.store.db import IDLE_IN_TRANSACTION, STATEMENT_TIMEOUT
from runner.store.dialect import dialect_of
from runner.store.prepared import Prepared
from runner.store.rows import CLAIM_COLS, CLAIMABLE, PRIORITIES, due_clause
from runner.store.tables import JSONType, attempts, instances

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
        #: PostgreSQL: the claim recording the pool seat of each claimed row whose state
        #: is in ``seats`` (params: those of ``claim`` and seats, ``pools.seated_json``)
        self.claim_seated = (
            Prepared(engine, claim_statement(engine, at, seated=True)) if d.skip_locked else None
        )
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
        #: PostgreSQL: the rest of the transaction plans index scans only, cancels a
        #: statement past ``db.STATEMENT_TIMEOUT``, and ends the session when it sits idle
        #: past ``db.IDLE_IN_TRANSACTION`` (a frozen daemon's locks); the server's clock is
        #: read in the same round trip (no params; the clock is the last column)
        self.by_index = None
        if d.skip_locked:
            ms = str(int(STATEMENT_TIMEOUT * 1000))
            idle = str(int(IDLE_IN_TRANSACTION * 1000))
            self.by_index = Prepared(
                engine,
                select(
                    func.set_config("enable_seqscan", "off", True),
                    func.set_config("enable_bitmapscan", "off", True),
                    func.set_config("statement_timeout", ms, True),
                    func.set_config("idle_in_transaction_session_timeout", idle, True),
                    literal_column(d.server_clock or "NULL"),
                ),
            )


def claim_statement(engine: Engine, at, seated: bool = False):
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
    seat: dict[str, Any] = {}
    if seated:
        from sqlalchemy.dialects.postgresql import JSONB  # (PostgreSQL only: not at import)

        table = cast(bindparam("seats", type_=String()), JSONB)
        seat["pool"] = func.jsonb_extract_path_text(table, c.version, c.state, "0")
        seat["pool_slots"] = cast(
            func.jsonb_extract_path_text(table, c.version, c.state, "1"), Integer()
        )
    return (
        update(instances)
        .where(chosen)
        .values(
            **seat,
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


_hot: weakref.WeakKeyDictionary[Engine, Hot] = weakref.WeakKeyDictionary()


def hot_for(conn: Connection) -> Hot:
    """The :class:`Hot` statements of ``conn``'s engine (compiled on first use; kept as
    long as the engine lives)."""
    engine = conn.engine
    hot = _hot.get(engine)
    if hot is None:
        hot = _hot[engine] = Hot(engine)
    return hot
