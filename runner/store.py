"""The worker's write side: create, claim, renew, fenced commit, release.

SQLModel defines the tables; this module uses SQLAlchemy Core statements with batched
commits, because the ORM's per-object overhead (~3.6k rows/s here) would dominate the loop
(Core with batched commits reaches ~40k rows/s on the same machine).

The protocol (after Takahē's Stator, made sharper by a fence):

1. :func:`claim_batch` claims up to ``limit`` due instances in one ``UPDATE ... WHERE id IN
   (SELECT ... ORDER BY due_at LIMIT n [FOR UPDATE SKIP LOCKED]) RETURNING``, bumping each
   row's ``fence``; in the same transaction it closes attempts a dead worker left
   unfinished (outcome ``lost``, one restart each) and inserts the new attempt rows.
2. :func:`renew` extends the leases of running attempts and reports which instances
   were taken away (fence or owner changed) so their attempts can be cancelled.
3. :func:`commit_outcomes` writes outcomes only where ``locked_by`` and ``fence`` still
   match the claim; a worker that lost its lease can write nothing to the instance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Float, and_, bindparam, func, insert, or_, select, update

from .db import Prepared, insert_ignore, json_adapter, skip_locked
from .models import JSONType, attempts, flow_versions, instances

#: Statuses a claim may pick up (``sleeping`` ones wake once due).
CLAIMABLE = ("runnable", "sleeping")


def now() -> float:
    """Seconds since the epoch, UTC."""
    return time.time()


def record_version(conn: Connection, flow: Any) -> None:
    """Store ``flow``'s source under its content hash (a no-op when already stored).

    Runs in the caller's transaction, so the version row commits (or rolls back) together
    with the instances that refer to it.

    Args:
        conn: a connection inside the caller's transaction.
        flow: a ``CompiledFlow`` (needs ``version``, ``name``, ``path``, ``source``).
    """
    insert_ignore(
        conn,
        flow_versions,
        {
            "version": flow.version,
            "flow": flow.name,
            "path": str(flow.path),
            "source": flow.source,
            "loaded_at": now(),
        },
    )


def initial_row(flow: Any, data: dict | None, *, event_id: int | None, at: float) -> dict:
    """The column values of a new instance of ``flow`` (not yet inserted)."""
    state = flow.states[flow.initial]
    status, due = "runnable", at
    if state.kind == "terminal":
        status, due = "completed", None
    elif state.kind == "external":
        due = None
    return {
        "flow": flow.name,
        "version": flow.version,
        "state": flow.initial,
        "status": status,
        "data": {**flow.data, **(data or {})},
        "due_at": due,
        "fence": 0,
        "attempts": 0,
        "errors": 0,
        "restarts": 0,
        "state_errors": [],
        "state_restarts": 0,
        "state_changed": at,
        "created_at": at,
        "updated_at": at,
        "event_id": event_id,
    }


def create_instance(
    conn: Connection,
    flow: Any,
    data: dict | None = None,
    *,
    event_id: int | None = None,
    at: float | None = None,
) -> int:
    """Insert one instance of ``flow`` (a ``CompiledFlow``) and return its id.

    ``data`` is merged over the flow's default ``data``. Runs inside the caller's
    transaction, so a rule can create the instance and mark its event handled atomically.
    """
    record_version(conn, flow)
    row = initial_row(flow, data, event_id=event_id, at=at if at is not None else now())
    return conn.execute(insert(instances).returning(instances.c.id), row).scalar_one()


def create_instances(conn: Connection, flow: Any, datas: Sequence[dict | None]) -> int:
    """Insert many instances of ``flow`` in one statement; returns how many."""
    record_version(conn, flow)
    at = now()
    rows = [initial_row(flow, d, event_id=None, at=at) for d in datas]
    if rows:
        conn.execute(insert(instances), rows)
    return len(rows)


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


_CLAIM_COLS = (
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


def _due_clause(at: float):
    return and_(
        instances.c.status.in_(CLAIMABLE),
        instances.c.due_at <= at,
        or_(instances.c.locked_until.is_(None), instances.c.locked_until < at),
    )


def has_due(conn: Connection, at: float) -> bool:
    """Cheap read (no write lock): is any instance due and unlocked at ``at``?"""
    q = select(instances.c.id).where(_due_clause(at)).limit(1)
    return conn.execute(q).first() is not None


class _Hot:
    """The worker's hot statements, compiled once per engine (see ``db.Prepared``)."""

    def __init__(self, engine: Engine):
        self.json = json_adapter(engine)
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
        self.commit_instances = Prepared(
            engine,
            update(instances)
            .where(
                instances.c.id == bindparam("b_id"),
                instances.c.locked_by == bindparam("b_worker"),
                instances.c.fence == bindparam("b_fence"),
            )
            .values(
                {
                    **{k: bindparam(k) for k in _INSTANCE_COMMIT_KEYS if k not in _KEEP_IF_NONE},
                    # None keeps the stored value: unchanged JSON is not rewritten
                    "state_changed": func.coalesce(
                        bindparam("state_changed", type_=Float()), instances.c.state_changed
                    ),
                    "data": func.coalesce(bindparam("data", type_=JSONType), instances.c.data),
                    "state_errors": func.coalesce(
                        bindparam("state_errors", type_=JSONType), instances.c.state_errors
                    ),
                    "locked_by": bindparam("b_lock"),
                    "locked_until": bindparam("b_until"),
                    "running_attempt": bindparam("b_next"),
                    "attempts": bindparam("b_attempts"),
                    "updated_at": bindparam("b_at"),
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


_hot: dict[int, _Hot] = {}


def _hot_for(conn: Connection) -> _Hot:
    engine = conn.engine
    hot = _hot.get(id(engine))
    if hot is None:
        hot = _hot[id(engine)] = _Hot(engine)
    return hot


def claim_batch(
    conn: Connection,
    worker_id: str,
    lease: float,
    limit: int,
    max_restarts_of: Callable[[str, str], int],
    at: float | None = None,
) -> tuple[list[Claim], list[int]]:
    """Claim up to ``limit`` due instances and open an attempt for each.

    Args:
        conn: a connection; the caller commits (one transaction per batch).
        worker_id: this worker's id, written to ``locked_by``.
        lease: seconds the claim lasts without renewal.
        limit: the most instances to claim.
        max_restarts_of: ``(version, state) -> int`` restarts allowed in that state.
        at: the current time (epoch seconds); defaults to now.

    Returns ``(claims, failed_ids)``: the claims to run, and the ids of instances whose
    lost attempt spent their last restart (now ``failed``, lock released). An attempt row
    still open when its instance is claimed was lost by a dead worker: it is closed as
    ``lost`` and counts one restart (majordomo); the new attempt starts from the data as
    last checkpointed.
    """
    at = now() if at is None else at
    inner = select(instances.c.id).where(_due_clause(at)).order_by(instances.c.due_at).limit(limit)
    if skip_locked(conn.engine):
        inner = inner.with_for_update(skip_locked=True)
    stmt = (
        update(instances)
        .where(instances.c.id.in_(inner.scalar_subquery()))
        .values(
            locked_by=worker_id,
            locked_until=at + lease,
            fence=instances.c.fence + 1,
            status="runnable",
            attempts=instances.c.attempts + 1,
            running_attempt=instances.c.attempts + 1,
            state_attempted=at,
            updated_at=at,
        )
        .returning(*_CLAIM_COLS)
    )
    rows = conn.execute(stmt).all()
    if not rows:
        return [], []
    claims = [
        Claim(
            id=r.id,
            flow=r.flow,
            version=r.version,
            state=r.state,
            data=r.data or {},
            fence=r.fence,
            attempt=r.attempts,
            errors=r.errors,
            restarts=r.restarts,
            state_errors=list(r.state_errors or []),
            state_restarts=r.state_restarts,
            event_id=r.event_id,
        )
        for r in rows
    ]
    failed = _close_lost(conn, claims, max_restarts_of, at)
    if failed:
        dead = set(failed)
        claims = [c for c in claims if c.id not in dead]
    _hot_for(conn).insert_attempts.executemany(
        conn,
        [
            {"i": c.id, "a": c.attempt, "s": c.state, "w": worker_id, "f": c.fence, "t": at}
            for c in claims
        ],
    )
    return claims, failed


def _close_lost(conn: Connection, claims: list[Claim], max_restarts_of, at: float) -> list[int]:
    """Close attempts left open by dead workers; returns ids that spent their restarts."""
    by_id = {c.id: c for c in claims}
    open_rows = conn.execute(
        select(attempts.c.instance_id, attempts.c.attempt, attempts.c.worker).where(
            attempts.c.instance_id.in_(list(by_id)), attempts.c.outcome.is_(None)
        )
    ).all()
    failed: list[int] = []
    for iid, number, who in open_rows:
        conn.execute(
            update(attempts)
            .where(attempts.c.instance_id == iid, attempts.c.attempt == number)
            .values(
                outcome="lost",
                finished_at=at,
                error=f"lost: worker {who} stopped renewing its lease mid-attempt",
            )
        )
        c = by_id[iid]
        c.restarts += 1
        c.state_restarts += 1
        c.lost.append(who)
    for c in claims:
        if not c.lost:
            continue
        allowed = max_restarts_of(c.version, c.state)
        values: dict = {"restarts": c.restarts, "state_restarts": c.state_restarts}
        if c.state_restarts > allowed:
            failed.append(c.id)
            values.update(
                status="failed",
                due_at=None,
                locked_by=None,
                locked_until=None,
                running_attempt=None,
                attempts=instances.c.attempts - 1,
                last_error=(
                    f"restarts spent: {c.state_restarts} lost attempts in state "
                    f"{c.state!r} (max_restarts {allowed})"
                ),
            )
        conn.execute(update(instances).where(instances.c.id == c.id).values(**values))
    return failed


def renew(
    conn: Connection, worker_id: str, held: dict[int, int], lease: float, at: float | None = None
) -> list[int]:
    """Extend the lease on every instance in ``held`` (``{instance id: fence}``).

    Returns the ids that are no longer ours as claimed: another worker owns them, or an
    operator command bumped the fence. Their attempts must be cancelled.
    """
    if not held:
        return []
    at = now() if at is None else at
    ids = list(held)
    conn.execute(
        update(instances)
        .where(instances.c.id.in_(ids), instances.c.locked_by == worker_id)
        .values(locked_until=at + lease)
    )
    return taken_away(conn, worker_id, held)


def taken_away(conn: Connection, worker_id: str, held: dict[int, int]) -> list[int]:
    """Read-only: which of ``held`` (``{id: fence}``) changed owner or fence."""
    if not held:
        return []
    q = select(instances.c.id, instances.c.locked_by, instances.c.fence).where(
        instances.c.id.in_(list(held))
    )
    seen = {i: (owner, fence) for i, owner, fence in conn.execute(q)}
    return [i for i, f in held.items() if seen.get(i) != (worker_id, f)]


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


_INSTANCE_COMMIT_KEYS = (
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
_JSON_KEYS = ("data", "state_errors")
_KEEP_IF_NONE = ("state_changed", "data", "state_errors")


def commit_outcomes(
    conn: Connection,
    worker_id: str,
    outcomes: Iterable[Outcome],
    at: float | None = None,
    *,
    lease: float = 60.0,
) -> tuple[list[int], list[Claim]]:
    """Commit finished attempts in one batch, fenced.

    Returns ``(lost_ids, chained)``: the ids whose fence was lost (only their attempt row
    is closed, as ``cancelled`` unless a new owner already closed it as ``lost``, and our
    lock released if still held), and a new :class:`Claim` for every outcome marked
    ``chain``: its instance stays locked by this worker (lease renewed) and its next
    attempt row is opened in the same transaction.
    """
    outcomes = list(outcomes)
    if not outcomes:
        return [], []
    at = now() if at is None else at
    q = select(instances.c.id, instances.c.fence).where(
        instances.c.id.in_([o.instance_id for o in outcomes]), instances.c.locked_by == worker_id
    )
    if skip_locked(conn.engine):
        q = q.with_for_update()
    current = dict(conn.execute(q).all())
    good = [o for o in outcomes if current.get(o.instance_id) == o.fence]
    lost = [o for o in outcomes if current.get(o.instance_id) != o.fence]
    hot = _hot_for(conn)
    js = hot.json
    rows, chained = [], []
    for o in good:
        row = {k: o.values[k] for k in _INSTANCE_COMMIT_KEYS}
        for k in _JSON_KEYS:
            row[k] = None if k in o.unchanged else js(row[k])
        row.update(b_id=o.instance_id, b_worker=worker_id, b_fence=o.fence, b_at=at)
        if o.chain is not None:
            nxt = _next_claim(o)
            chained.append(nxt)
            row.update(
                b_lock=worker_id, b_until=at + lease, b_next=nxt.attempt, b_attempts=nxt.attempt
            )
        else:
            row.update(b_lock=None, b_until=None, b_next=None, b_attempts=o.attempt)
        rows.append(row)
    hot.commit_instances.executemany(conn, rows)
    hot.commit_attempts.executemany(
        conn,
        [
            {
                "b_id": o.instance_id,
                "b_attempt": o.attempt,
                "b_at": at,
                "outcome": o.attempt_values.get("outcome"),
                "to_state": o.attempt_values.get("to_state"),
                "error": o.attempt_values.get("error"),
                "checkpoint": js(o.attempt_values.get("checkpoint")),
            }
            for o in good
        ],
    )
    hot.insert_attempts.executemany(
        conn,
        [
            {"i": c.id, "a": c.attempt, "s": c.state, "w": worker_id, "f": c.fence, "t": at}
            for c in chained
        ],
    )
    for o in lost:
        cancel_attempt(conn, worker_id, o.instance_id, o.attempt, "lease or fence lost", at=at)
    return [o.instance_id for o in lost], chained


def _next_claim(o: Outcome) -> Claim:
    prev, v = o.chain, o.values
    assert prev is not None
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
        chain=prev.chain + 1,
    )


def cancel_attempt(
    conn: Connection,
    worker_id: str,
    instance_id: int,
    attempt: int,
    reason: str,
    *,
    outcome: str = "cancelled",
    at: float | None = None,
) -> None:
    """Close an attempt whose instance was taken away, and release our lock if still ours.

    Writes nothing to the instance but the lock columns, and only while ``locked_by`` is
    still this worker and ``running_attempt`` is this attempt.
    """
    at = now() if at is None else at
    conn.execute(
        update(attempts)
        .where(
            attempts.c.instance_id == instance_id,
            attempts.c.attempt == attempt,
            attempts.c.outcome.is_(None),
        )
        .values(outcome=outcome, finished_at=at, error=reason)
    )
    conn.execute(
        update(instances)
        .where(
            instances.c.id == instance_id,
            instances.c.locked_by == worker_id,
            instances.c.running_attempt == attempt,
        )
        .values(locked_by=None, locked_until=None, running_attempt=None, updated_at=at)
    )


def save_checkpoint(
    conn: Connection,
    worker_id: str,
    instance_id: int,
    fence: int,
    attempt: int,
    data: dict,
    checkpoint: dict,
) -> bool:
    """Durably store a handler's checkpoint mid-attempt; False when the fence was lost.

    ``data`` is the instance's whole data after merging ``checkpoint`` into it; the next
    attempt (or restart) starts from it (majordomo's "update state" message).
    """
    res = conn.execute(
        update(instances)
        .where(
            instances.c.id == instance_id,
            instances.c.locked_by == worker_id,
            instances.c.fence == fence,
        )
        .values(data=data, updated_at=now())
    )
    if res.rowcount != 1:
        return False
    conn.execute(
        update(attempts)
        .where(attempts.c.instance_id == instance_id, attempts.c.attempt == attempt)
        .values(checkpoint=checkpoint)
    )
    return True


def release_all(conn: Connection, worker_id: str) -> int:
    """Release every lock ``worker_id`` holds on instances with no attempt running."""
    res = conn.execute(
        update(instances)
        .where(instances.c.locked_by == worker_id, instances.c.running_attempt.is_(None))
        .values(locked_by=None, locked_until=None)
    )
    return res.rowcount or 0


def busy_count(conn: Connection, at: float | None = None) -> int:
    """Instances with work left: runnable/sleeping with a due time, or an attempt running
    under a lease still valid (an orphan of a dead worker on a paused instance is not
    work: it is closed when the instance is resumed or killed)."""
    at = now() if at is None else at
    q = select(func.count()).where(
        or_(
            and_(instances.c.running_attempt.is_not(None), instances.c.locked_until > at),
            and_(instances.c.status.in_(CLAIMABLE), instances.c.due_at.is_not(None)),
        )
    )
    return conn.execute(q).scalar_one()
