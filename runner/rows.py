"""The rows the worker's hot path passes around, and its precompiled statements.

``Claim`` (an instance claimed with its attempt open) and ``Outcome`` (what a finished
attempt writes) are shared by the claim side (``runner.store``) and the commit side
(``runner.commit``); ``hot_for(conn)`` gives the statements both run thousands of times a
second, compiled once per engine (``db.Prepared``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Integer,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    update,
)

from .db import Prepared, ids_in, json_adapter, json_loader, skip_locked
from .models import JSONType, attempts, instances

#: Statuses a claim may pick up (``sleeping`` ones wake once due).
CLAIMABLE = ("runnable", "sleeping")

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
)


def due_clause(at):
    """Due and unlocked at ``at`` (epoch seconds, or a bind parameter): what a claim takes.

    The statuses are literals, so the clause compiles to one fixed SQL string.
    """
    return and_(
        instances.c.status.in_([literal_column(f"'{s}'") for s in CLAIMABLE]),
        instances.c.due_at <= at,
        or_(instances.c.locked_until.is_(None), instances.c.locked_until < at),
    )


@dataclass
class Claim:
    """One claimed instance with the attempt just opened for it (``attempt`` is 1-based)."""

    id: int
    flow: str
    version: str
    state: str
    data: dict
    fence: int
    attempt: int
    errors: int
    restarts: int
    state_errors: list[float]
    state_restarts: int
    event_id: int | None
    lost: list[str] = field(default_factory=list)
    chain: int = 0  # moves made since this instance was last claimed from the table


@dataclass
class Outcome:
    """What one finished attempt does to its instance and attempt rows.

    ``values`` holds the instance columns to write (the worker computes them from the
    flow's policy); ``attempt_values`` the attempt columns (outcome, to_state, error,
    checkpoint). ``values`` is ignored when the fence no longer matches.
    """

    instance_id: int
    attempt: int
    fence: int
    values: dict
    attempt_values: dict
    chain: Claim | None = None  # set: keep the lease and start the next attempt at once
    unchanged: tuple[str, ...] = ()  # JSON columns equal to the stored value: not rewritten


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
)
KEEP_IF_NONE = ("state_changed", "data", "state_errors")
#: Outcome columns in an index (``ix_instances_claim``, ``ix_instances_flow_status``).
INDEXED = ("status", "due_at")


class Hot:
    """The worker's hot statements, compiled once per engine (see ``db.Prepared``)."""

    def __init__(self, engine: Engine):
        self.json = json_adapter(engine)
        self.load_json = json_loader(engine)
        at = bindparam("at", type_=Float())
        inner = (
            select(instances.c.id)
            .where(due_clause(at))
            .order_by(instances.c.due_at)
            .limit(bindparam("n", type_=Integer()))
        )
        if skip_locked(engine):
            inner = inner.with_for_update(skip_locked=True)
        #: claim up to ``n`` due instances (params: at, n, w, until)
        self.claim = Prepared(
            engine,
            update(instances)
            .where(instances.c.id.in_(inner.scalar_subquery()))
            .values(
                locked_by=bindparam("w"),
                locked_until=bindparam("until", type_=Float()),
                fence=instances.c.fence + 1,
                status="runnable",
                attempts=instances.c.attempts + 1,
                running_attempt=instances.c.attempts + 1,
                state_attempted=at,
                updated_at=at,
            )
            .returning(*CLAIM_COLS),
        )
        #: attempts still open on the given instances: lost by a dead worker (param: ids)
        self.open_attempts = Prepared(
            engine,
            select(attempts.c.instance_id, attempts.c.attempt, attempts.c.worker).where(
                ids_in(engine, attempts.c.instance_id), attempts.c.outcome.is_(None)
            ),
        )
        #: the fences of the given instances this worker still holds (params: ids, w)
        fences = select(instances.c.id, instances.c.fence).where(
            ids_in(engine, instances.c.id), instances.c.locked_by == bindparam("w")
        )
        if skip_locked(engine):
            fences = fences.with_for_update()
        self.fences = Prepared(engine, fences)
        self.insert_attempts = Prepared(
            engine,
            insert(attempts).values(
                instance_id=bindparam("i"),
                attempt=bindparam("a"),
                state=bindparam("s"),
                worker=bindparam("w"),
                fence=bindparam("f"),
                started_at=bindparam("t"),
            ),
        )
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
        #: an outcome that releases its instance (params: COMMIT_KEYS and b_*)
        self.commit_instances = Prepared(
            engine,
            update(instances)
            .where(*fenced)
            .values(
                {
                    **outcome_cols,
                    "status": bindparam("status"),
                    "due_at": bindparam("due_at", type_=Float()),
                    "locked_by": null(),
                    "locked_until": null(),
                    "running_attempt": null(),
                }
            ),
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
                }
            ),
        )
        self.commit_attempts = Prepared(
            engine,
            update(attempts)
            .where(
                attempts.c.instance_id == bindparam("b_id"),
                attempts.c.attempt == bindparam("b_attempt"),
            )
            .values(
                finished_at=bindparam("b_at"),
                outcome=bindparam("outcome"),
                to_state=bindparam("to_state"),
                error=bindparam("error"),
                checkpoint=bindparam("checkpoint"),
            ),
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
