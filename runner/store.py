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

from sqlalchemy import Connection, Float, and_, bindparam, func, insert, or_, select, update

from .db import insert_ignore, skip_locked
from .models import attempts, flow_versions, instances

#: Statuses a claim may pick up (``sleeping`` ones wake once due).
CLAIMABLE = ("runnable", "sleeping")


def now() -> float:
    """Seconds since the epoch, UTC."""
    return time.time()


_recorded_versions: set[str] = set()


def record_version(conn: Connection, flow: Any) -> None:
    """Store ``flow``'s source under its content hash (once per process and version).

    Args:
        conn: a connection inside the caller's transaction.
        flow: a ``CompiledFlow`` (needs ``version``, ``name``, ``path``, ``source``).
    """
    if flow.version in _recorded_versions:
        return
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
    _recorded_versions.add(flow.version)


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
    """One claimed instance with the attempt row just opened for it."""

    id: int
    flow: str
    version: str
    state: str
    data: dict
    fence: int
    attempt_id: int
    attempt: int
    errors: int
    restarts: int
    state_errors: list[float]
    state_restarts: int
    event_id: int | None
    lost: list[str] = field(default_factory=list)


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
    instances.c.running_attempt,
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


def next_due(conn: Connection) -> float | None:
    """The earliest ``due_at`` of a claimable instance, or ``None``."""
    q = select(func.min(instances.c.due_at)).where(instances.c.status.in_(CLAIMABLE))
    return conn.execute(q).scalar()


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
    lost attempt spent their last restart (now ``failed``, lock released).
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
            state_attempted=at,
            updated_at=at,
        )
        .returning(*_CLAIM_COLS)
    )
    rows = conn.execute(stmt).mappings().all()
    if not rows:
        return [], []
    lost_ids = [r["running_attempt"] for r in rows if r["running_attempt"] is not None]
    lost_workers: dict[int, str] = {}
    if lost_ids:
        q = select(attempts.c.id, attempts.c.worker).where(attempts.c.id.in_(lost_ids))
        lost_workers = {a: w for a, w in conn.execute(q)}
        conn.execute(
            update(attempts)
            .where(attempts.c.id.in_(lost_ids), attempts.c.outcome.is_(None))
            .values(outcome="lost", finished_at=at),
        )
        for a in lost_ids:
            who = lost_workers.get(a, "?")
            conn.execute(
                update(attempts)
                .where(attempts.c.id == a, attempts.c.error.is_(None))
                .values(error=f"lost: worker {who} stopped renewing its lease mid-attempt")
            )
    claims: list[Claim] = []
    failed: list[dict] = []
    for r in rows:
        restarts, state_restarts = r["restarts"], r["state_restarts"]
        lost: list[str] = []
        if r["running_attempt"] is not None:
            restarts += 1
            state_restarts += 1
            lost.append(lost_workers.get(r["running_attempt"], "?"))
            allowed = max_restarts_of(r["version"], r["state"])
            if state_restarts > allowed:
                failed.append(
                    {
                        "b_id": r["id"],
                        "b_fence": r["fence"],
                        "restarts": restarts,
                        "state_restarts": state_restarts,
                        "last_error": (
                            f"restarts spent: {state_restarts} lost attempts in state "
                            f"{r['state']!r} (max_restarts {allowed})"
                        ),
                    }
                )
                continue
        claims.append(
            Claim(
                id=r["id"],
                flow=r["flow"],
                version=r["version"],
                state=r["state"],
                data=r["data"] or {},
                fence=r["fence"],
                attempt_id=0,
                attempt=r["attempts"] + 1,
                errors=r["errors"],
                restarts=restarts,
                state_errors=list(r["state_errors"] or []),
                state_restarts=state_restarts,
                event_id=r["event_id"],
                lost=lost,
            )
        )
    if failed:
        conn.execute(
            update(instances)
            .where(instances.c.id == bindparam("b_id"), instances.c.fence == bindparam("b_fence"))
            .values(
                status="failed",
                due_at=None,
                locked_by=None,
                locked_until=None,
                running_attempt=None,
                restarts=bindparam("restarts"),
                state_restarts=bindparam("state_restarts"),
                last_error=bindparam("last_error"),
            ),
            failed,
        )
    if claims:
        new_rows = [
            {
                "instance_id": c.id,
                "attempt": c.attempt,
                "state": c.state,
                "worker": worker_id,
                "fence": c.fence,
                "started_at": at,
            }
            for c in claims
        ]
        ids = conn.execute(
            insert(attempts).returning(attempts.c.id, sort_by_parameter_order=True), new_rows
        ).scalars()
        for c, attempt_id in zip(claims, ids, strict=True):
            c.attempt_id = attempt_id
        conn.execute(
            update(instances)
            .where(instances.c.id == bindparam("b_id"))
            .values(
                running_attempt=bindparam("b_attempt"),
                attempts=bindparam("b_attempts"),
                restarts=bindparam("b_restarts"),
                state_restarts=bindparam("b_state_restarts"),
            ),
            [
                {
                    "b_id": c.id,
                    "b_attempt": c.attempt_id,
                    "b_attempts": c.attempt,
                    "b_restarts": c.restarts,
                    "b_state_restarts": c.state_restarts,
                }
                for c in claims
            ],
        )
    return claims, [f["b_id"] for f in failed]


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
    attempt_id: int
    fence: int
    values: dict
    attempt_values: dict


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


def commit_outcomes(
    conn: Connection, worker_id: str, outcomes: Iterable[Outcome], at: float | None = None
) -> list[int]:
    """Commit finished attempts in one batch, fenced; returns the ids whose fence was lost.

    For a lost fence only the attempt row is closed (as ``cancelled``, unless a new owner
    already closed it as ``lost``) and this worker's lock, if still held, is released.
    """
    outcomes = list(outcomes)
    if not outcomes:
        return []
    at = now() if at is None else at
    held = {o.instance_id: o.fence for o in outcomes}
    q = select(instances.c.id, instances.c.fence).where(
        instances.c.id.in_(list(held)), instances.c.locked_by == worker_id
    )
    if skip_locked(conn.engine):
        q = q.with_for_update()
    current = dict(conn.execute(q).all())
    good = [o for o in outcomes if current.get(o.instance_id) == o.fence]
    lost = [o for o in outcomes if current.get(o.instance_id) != o.fence]
    if good:
        conn.execute(
            update(instances)
            .where(
                instances.c.id == bindparam("b_id"),
                instances.c.locked_by == worker_id,
                instances.c.fence == bindparam("b_fence"),
            )
            .values(
                {
                    **{k: bindparam(k) for k in _INSTANCE_COMMIT_KEYS if k != "state_changed"},
                    "state_changed": func.coalesce(
                        bindparam("state_changed", type_=Float()), instances.c.state_changed
                    ),
                    "locked_by": None,
                    "locked_until": None,
                    "running_attempt": None,
                    "updated_at": at,
                }
            ),
            [
                {
                    "b_id": o.instance_id,
                    "b_fence": o.fence,
                    **{k: o.values[k] for k in _INSTANCE_COMMIT_KEYS},
                }
                for o in good
            ],
        )
        conn.execute(
            update(attempts)
            .where(attempts.c.id == bindparam("b_id"))
            .values(
                finished_at=at,
                outcome=bindparam("outcome"),
                to_state=bindparam("to_state"),
                error=bindparam("error"),
                checkpoint=bindparam("checkpoint"),
            ),
            [
                {
                    "b_id": o.attempt_id,
                    "outcome": o.attempt_values.get("outcome"),
                    "to_state": o.attempt_values.get("to_state"),
                    "error": o.attempt_values.get("error"),
                    "checkpoint": o.attempt_values.get("checkpoint"),
                }
                for o in good
            ],
        )
    for o in lost:
        cancel_attempt(conn, worker_id, o.instance_id, o.attempt_id, "lease or fence lost", at=at)
    return [o.instance_id for o in lost]


def cancel_attempt(
    conn: Connection,
    worker_id: str,
    instance_id: int,
    attempt_id: int,
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
        .where(attempts.c.id == attempt_id, attempts.c.outcome.is_(None))
        .values(outcome=outcome, finished_at=at, error=reason)
    )
    conn.execute(
        update(instances)
        .where(
            instances.c.id == instance_id,
            instances.c.locked_by == worker_id,
            instances.c.running_attempt == attempt_id,
        )
        .values(locked_by=None, locked_until=None, running_attempt=None, updated_at=at)
    )


def save_checkpoint(
    conn: Connection,
    worker_id: str,
    instance_id: int,
    fence: int,
    attempt_id: int,
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
    conn.execute(update(attempts).where(attempts.c.id == attempt_id).values(checkpoint=checkpoint))
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
    """Instances with work left: runnable/sleeping with a due time, or an attempt running."""
    q = select(func.count()).where(
        or_(
            instances.c.running_attempt.is_not(None),
            and_(instances.c.status.in_(CLAIMABLE), instances.c.due_at.is_not(None)),
        )
    )
    return conn.execute(q).scalar_one()
