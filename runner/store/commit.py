"""The commit side of the worker: fenced outcomes, cancelled attempts, checkpoints.

Every write here is fenced: it lands only while ``locked_by`` and ``fence`` still match the
claim, so a worker that lost its lease (or whose instance an operator paused, killed or
moved) can write nothing to the instance (see ``runner.store.leases`` for the protocol).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, update

from runner.store.clock import db_now
from runner.store.deadlines import entered
from runner.store.dialect import dialect_of
from runner.store.hot import Hot, hot_for
from runner.store.lifecycle_events import emit, outcome_events, wanted
from runner.store.notify import notify_due
from runner.store.rows import CLAIMABLE, Claim, Outcome, attempt_row, next_claim
from runner.store.tables import attempts, instances


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
    is written, as ``cancelled`` unless a new owner already recorded it as ``lost``, and
    our lock released if still held), and a new :class:`Claim` for every outcome marked
    ``chain``: its instance stays locked by this worker (lease renewed) and names the next
    attempt in ``running_attempt``. Each finished attempt's row is written here, once.

    Where a batch is one statement (``Dialect.batch_statements``: PostgreSQL)
    the fenced update itself says which claims were still held (``RETURNING``), so no
    fence is read first (``runner.store.batch``).

    ``optimistic`` (used only where the database serialises writers, ``Dialect.serial_writes``:
    SQLite) skips reading the fences first and counts the rows the fenced updates
    changed instead; when one claim was no longer held it raises :class:`FenceMoved`
    before any attempt row is written.
    """
    outcomes = list(outcomes)
    if not outcomes:
        return [], []
    at = db_now(conn) if at is None else at
    hot = hot_for(conn)
    optimistic = optimistic and hot.dialect.serial_writes
    batch = None
    if hot.dialect.batch_statements:  # PostgreSQL; SQLite never loads its types
        from runner.store.batch import batch_for

        batch = batch_for(conn)
    if optimistic or batch is not None:  # (batch: the fenced update says which held)
        good, lost = outcomes, []
    else:
        ids = hot.dialect.ids_value([o.instance_id for o in outcomes])
        current = dict(hot.fences.fetch(conn, {"ids": ids, "w": worker_id}))
        good = [o for o in outcomes if current.get(o.instance_id) == o.fence]
        lost = [o for o in outcomes if current.get(o.instance_id) != o.fence]
    if batch is not None:  # one statement: fenced updates and the attempt rows
        from runner.store.batch import batch_rows

        released, kept, chained, finished = batch_rows(good, worker_id, at)
        held = batch.commit(conn, worker_id, at, at + lease, (released, kept, finished))
        if len(held) != len(good):  # taken away: their attempt rows were not written
            lost = [o for o in good if o.instance_id not in held]
            chained = [c for c in chained if c.id in held]
        if hot.dialect.notify:
            freed = [o.values for o in good if not o.chain and o.instance_id in held]
            _notify_released(conn, freed)
        finished = []
    else:
        changed, chained, finished = _commit_rows(conn, hot, worker_id, good, at, lease)
        if optimistic and changed != len(good):
            raise FenceMoved(f"{len(good) - changed} of {len(good)} claims no longer held")
    hot.close_attempts.executemany(conn, finished)
    lost_ids = {o.instance_id for o in lost}
    if wanted(conn):  # lifecycle events, in the transition's transaction
        held_now = [o for o in good if not o.chain and o.instance_id not in lost_ids]
        emit(conn, outcome_events(worker_id, held_now, at))
    deadline_moves = [  # moves into states of flows with deadlines (store.deadlines)
        (o.instance_id, flow, o.values["state"], o.values["state_changed"])
        for o in good
        if (flow := o.values.get("deadline_flow")) is not None and o.instance_id not in lost_ids
    ]
    if deadline_moves:
        entered(conn, deadline_moves)
    for o in lost:
        cancel_attempt(conn, worker_id, o.claim, "lease or fence lost", at=at)
    return [o.instance_id for o in lost], chained


def _commit_rows(
    conn: Connection, hot: Hot, worker_id: str, good: list[Outcome], at: float, lease: float
) -> tuple[int, list[Claim], list[dict[str, Any]]]:
    """The outcomes ``good`` written one statement a row (``executemany``: SQLite, where a
    statement is no round trip); returns how many instance rows changed, the chained
    claims and the attempt rows still to write (``rows.attempt_row``)."""
    js = hot.json
    released, kept, chained, finished = [], [], [], []
    routed: list[dict[str, Any]] = []  # released into another requirement
    seated: list[dict[str, Any]] = []  # released from a pool's seat
    for o in good:  # the hot loop: plain item assignments, no helper calls per field
        v, c, av = o.values, o.claim, o.attempt_values
        row = {
            "state": v["state"],
            "errors": v["errors"],
            "restarts": v["restarts"],
            "state_restarts": v["state_restarts"],
            "last_error": v["last_error"],
            "state_changed": v["state_changed"],
            "data": None if "data" in o.unchanged else js(v["data"]),
            "state_errors": None if "state_errors" in o.unchanged else js(v["state_errors"]),
            "b_id": c.id,
            "b_worker": worker_id,
            "b_fence": c.fence,
            "b_at": at,
        }
        if o.chain:
            nxt = next_claim(o, at)
            chained.append(nxt)
            row["b_until"] = at + lease
            row["b_next"] = row["b_attempts"] = nxt.attempt
            kept.append(row)
        else:
            row["status"] = v["status"]
            row["due_at"] = v["due_at"]
            row["priority"] = v.get("priority")  # a move's; None keeps the row's
            row["b_attempts"] = c.attempt
            if "runs_on" in v and v["runs_on"] != c.runs_on:  # to another requirement
                row["runs_on"] = v["runs_on"] or ""
                routed.append(row)
            elif c.pool is not None:
                seated.append(row)
                o.seat_freed = True
            else:
                released.append(row)
        checkpoint = av["checkpoint"]
        finished.append(
            attempt_row(
                c,
                worker_id,
                at,
                av["outcome"],
                av["to_state"],
                av["error"],
                None if checkpoint is None else js(checkpoint),
                av.get("log_bytes"),
            )
        )
    changed = hot.commit_instances.executemany(conn, released)
    if routed:
        changed += hot.commit_routed.executemany(conn, routed)
        released += routed
    if seated:
        changed += hot.commit_pooled.executemany(conn, seated)
        released += seated
    changed += hot.commit_chained.executemany(conn, kept)
    if released and hot.dialect.notify:
        _notify_released(conn, released)
    return changed, chained, finished


def _notify_released(conn: Connection, released: list[dict[str, Any]]) -> None:
    """Tell the listening daemons when the instances this commit released are due again
    (a backoff, a try interval, a move another worker may take): one notification, the
    earliest due time, sent when the transaction commits (``runner.store.notify``);
    ``released``: their ``status`` and ``due_at`` (dicts)."""
    due = [r["due_at"] for r in released if r["status"] in CLAIMABLE and r["due_at"] is not None]
    if due:
        notify_due(conn, min(due))


def cancel_attempt(
    conn: Connection,
    worker_id: str,
    claim: Claim,
    reason: str,
    *,
    outcome: str = "cancelled",
    at: float | None = None,
) -> None:
    """Record the attempt of ``claim`` as ended without a result (``cancelled``: its
    instance was taken away, or the worker stops), and release our lock if still ours.

    The row is left as it is when another worker already recorded the attempt (``lost``).
    Writes nothing to the instance but the lock columns, and only while ``locked_by`` is
    still this worker and ``running_attempt`` is this attempt.
    """
    at = db_now(conn) if at is None else at
    hot_for(conn).close_attempts.executemany(
        conn, [attempt_row(claim, worker_id, at, outcome, error=reason)]
    )
    conn.execute(
        update(instances)
        .where(
            instances.c.id == claim.id,
            instances.c.locked_by == worker_id,
            instances.c.running_attempt == claim.attempt,
        )
        .values(locked_by=None, locked_until=None, running_attempt=None, updated_at=at)
    )


def give_back(
    conn: Connection, worker_id: str, claims: Iterable[Claim], *, at: float | None = None
) -> int:
    """Undo the claims of attempts that never started (claimed ahead, then not needed:
    the worker stops, or its slots stayed busy too long); returns how many were undone.

    A claim still held as claimed (``locked_by``, ``fence`` and ``running_attempt`` as
    the claim left them) is undone: unlocked, no attempt running, its attempt count back
    (no row is written: nothing ran), due as it was, and the listening daemons are told.
    One whose fence moved meanwhile (a command, another worker) is closed as
    ``cancelled`` instead (:func:`cancel_attempt`), like an attempt cancelled at once.
    """
    at = db_now(conn) if at is None else at
    i = instances.c
    undone = 0
    for claim in claims:  # rare (a stop, a long wait): one statement each
        res = conn.execute(
            update(instances)
            .where(
                i.id == claim.id,
                i.locked_by == worker_id,
                i.fence == claim.fence,
                i.running_attempt == claim.attempt,
            )
            .values(
                locked_by=None,
                locked_until=None,
                running_attempt=None,
                attempts=claim.attempt - 1,
                updated_at=at,
            )
        )
        if res.rowcount == 1:
            undone += 1
        else:
            cancel_attempt(conn, worker_id, claim, "cancelled before it started", at=at)
    if undone:
        notify_due(conn)
    return undone


def save_checkpoint(
    conn: Connection,
    worker_id: str,
    claim: Claim,
    data: dict[str, Any],
    checkpoint: dict[str, Any],
) -> bool:
    """Durably store a handler's checkpoint mid-attempt; False when the fence was lost.

    ``data`` is the instance's whole data after merging ``checkpoint`` into it; the next
    attempt (or restart) starts from it (majordomo's "update state" message). The
    attempt's row is written now, still open (``outcome`` NULL), with ``checkpoint``; the
    attempt's end completes it.
    """
    res = conn.execute(
        update(instances)
        .where(
            instances.c.id == claim.id,
            instances.c.locked_by == worker_id,
            instances.c.fence == claim.fence,
        )
        .values(data=data, updated_at=db_now(conn))
    )
    if res.rowcount != 1:
        return False
    ins = (
        dialect_of(conn)
        .insert(attempts)
        .values(
            instance_id=claim.id,
            attempt=claim.attempt,
            state=claim.state,
            worker=worker_id,
            fence=claim.fence,
            started_at=claim.started_at,
            checkpoint=checkpoint,
        )
    )
    conn.execute(
        ins.on_conflict_do_update(
            index_elements=[attempts.c.instance_id, attempts.c.attempt],
            set_={"checkpoint": ins.excluded.checkpoint},
            where=attempts.c.outcome.is_(None),
        )
    )
    return True
