"""The commit side of the worker: fenced outcomes, cancelled attempts, checkpoints.

Every write here is fenced: it lands only while ``locked_by`` and ``fence`` still match the
claim, so a worker that lost its lease (or whose instance an operator paused, killed or
moved) can write nothing to the instance (see ``runner.store`` for the protocol).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import Connection, update

from .db import ids_value, serial_writes
from .models import attempts, instances
from .rows import Claim, Outcome, hot_for


class FenceMoved(Exception):
    """An optimistic :func:`commit_outcomes` found a claim no longer held.

    Part of the batch is already written: the caller must roll the transaction back and
    commit again with ``optimistic=False``.
    """


def commit_outcomes(
    conn: Connection,
    worker_id: str,
    outcomes: Iterable[Outcome],
    at: float | None = None,
    *,
    lease: float = 60.0,
    optimistic: bool = False,
) -> tuple[list[int], list[Claim]]:
    """Commit finished attempts in one batch, fenced.

    Returns ``(lost_ids, chained)``: the ids whose fence was lost (only their attempt row
    is closed, as ``cancelled`` unless a new owner already closed it as ``lost``, and our
    lock released if still held), and a new :class:`Claim` for every outcome marked
    ``chain``: its instance stays locked by this worker (lease renewed) and its next
    attempt row is opened in the same transaction.

    ``optimistic`` (used only where the database serialises writers, ``db.serial_writes``:
    SQLite) skips reading the fences first and counts the rows the fenced updates
    changed instead; when one claim was no longer held it raises :class:`FenceMoved`
    before any attempt row is written.
    """
    outcomes = list(outcomes)
    if not outcomes:
        return [], []
    at = time.time() if at is None else at
    hot = hot_for(conn)
    optimistic = optimistic and serial_writes(conn.engine)
    if optimistic:
        good, lost = outcomes, []
    else:
        ids = ids_value(conn.engine, [o.instance_id for o in outcomes])
        current = dict(hot.fences.fetch(conn, {"ids": ids, "w": worker_id}))
        good = [o for o in outcomes if current.get(o.instance_id) == o.fence]
        lost = [o for o in outcomes if current.get(o.instance_id) != o.fence]
    js = hot.json
    released, kept, chained = [], [], []
    for o in good:
        v = o.values
        row = {
            "state": v["state"],
            "errors": v["errors"],
            "restarts": v["restarts"],
            "state_restarts": v["state_restarts"],
            "last_error": v["last_error"],
            "state_changed": v["state_changed"],
            "data": None if "data" in o.unchanged else js(v["data"]),
            "state_errors": None if "state_errors" in o.unchanged else js(v["state_errors"]),
            "b_id": o.instance_id,
            "b_worker": worker_id,
            "b_fence": o.fence,
            "b_at": at,
        }
        if o.chain is not None:
            assert v["status"] == "runnable", "only a runnable outcome keeps its lock"
            nxt = _next_claim(o)
            chained.append(nxt)
            row.update(b_until=at + lease, b_next=nxt.attempt, b_attempts=nxt.attempt)
            kept.append(row)
        else:
            row.update(status=v["status"], due_at=v["due_at"], b_attempts=o.attempt)
            released.append(row)
    changed = hot.commit_instances.executemany(conn, released)
    changed += hot.commit_chained.executemany(conn, kept)
    if optimistic and changed != len(good):
        raise FenceMoved(f"{len(good) - changed} of {len(good)} claims no longer held")
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
    at = time.time() if at is None else at
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
        .values(data=data, updated_at=time.time())
    )
    if res.rowcount != 1:
        return False
    conn.execute(
        update(attempts)
        .where(attempts.c.instance_id == instance_id, attempts.c.attempt == attempt)
        .values(checkpoint=checkpoint)
    )
    return True
