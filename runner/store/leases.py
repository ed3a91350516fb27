"""Leases: claim due instances, renew, recover lost attempts, release (creating is
``runner.store.create``; the fenced commit is ``runner.store.commit``).

SQLModel defines the tables; this module uses SQLAlchemy Core statements with batched
commits, because the ORM's per-object overhead (~3.6k rows/s here) would dominate the loop
(Core with batched commits reaches ~40k rows/s on the same machine).

The protocol (after Takahē's Stator, made sharper by a fence):

1. :func:`claim_batch` claims up to ``limit`` due instances in one ``UPDATE ... WHERE id IN
   (SELECT ... ORDER BY due_at LIMIT n [FOR UPDATE SKIP LOCKED]) RETURNING``, bumping each
   row's ``fence`` and naming the attempt it starts in ``running_attempt``; the attempt's
   row is written once, when it ends. :func:`recover_lost` records attempts a dead worker
   left running (outcome ``lost``, one restart each) once their lease has expired.
2. :func:`renew` extends the leases of running attempts and reports which instances
   were taken away (fence or owner changed) so their attempts can be cancelled.
3. ``runner.store.commit.commit_outcomes`` writes outcomes only where ``locked_by`` and
   ``fence`` still match the claim; a worker that lost its lease can write nothing to the instance.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    exists,
    func,
    or_,
    select,
    update,
)

from runner.flowspec import faults
from runner.flowspec.policy import Policy
from runner.store.clock import db_now
from runner.store.dead import dead_holders
from runner.store.dialect import dialect_of
from runner.store.hot import hot_for
from runner.store.lifecycle_events import emit_lost
from runner.store.pool_settle import StandbyAsk, settle, standbys
from runner.store.pools import Seat, seat_of, seated_json
from runner.store.rows import (
    CLAIMABLE,
    Claim,
    running_attempt_row,
)
from runner.store.tables import instances


def now() -> float:
    """Seconds since the epoch, UTC, by this host's clock (the worker's statements use
    the database's: ``runner.store.clock.db_now``)."""
    return time.time()


def by_index(conn: Connection) -> None:
    """PostgreSQL: plan the rest of the caller's transaction (a worker's cycle) with index
    scans only (``SET LOCAL enable_seqscan, enable_bitmapscan = off``, one round trip),
    with a ``statement_timeout`` (``db.STATEMENT_TIMEOUT``) and an
    ``idle_in_transaction_session_timeout`` (``db.IDLE_IN_TRANSACTION``: a daemon frozen
    inside the transaction loses it, and its locks, instead of stalling the fleet), and
    read the server's clock in the same statement (``runner.store.clock``: leases are
    judged by the database's time); nothing on SQLite.

    The cycle's statements each touch a few rows, found by an index: the claim reads the
    oldest due rows in ``(status, due_at)`` order and stops after ``n``, the commit looks
    each row of its batch up by primary key. PostgreSQL's planner chose other plans
    whenever its statistics were missing or stale (a new table before autovacuum's first
    ``ANALYZE``; a burst of runnable instances in a table analyzed when they were rare):
    a bitmap scan of every due row and a sort for each claim (9 ms a claim of 256 with
    20,000 queued, against 1 ms), a sequential scan of the table or a nested loop over
    the batch for each commit (17-47 ms for 256 rows, against 2-5 ms). A statement
    with no index to use (a count over OR-ed conditions) still runs, by a sequential scan.
    """
    hot = hot_for(conn)
    steer = hot.by_index
    if steer is not None:
        sent = time.time()
        rows = steer.fetch(conn, {})
        hot.clock.observe(float(rows[0][-1]), sent, time.time())


def claim_batch(
    conn: Connection,
    worker_id: str,
    lease: float,
    limit: int,
    at: float | None = None,
    labels: str | None = None,
    refused: list[int] | None = None,
    standby: Mapping[str, int] | None = None,
    standby_most: int = 0,
    filled: list[str] | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` due instances and start an attempt on each.

    Args:
        conn: a connection; the caller commits (one transaction per batch).
        worker_id: this worker's id, written to ``locked_by``.
        lease: seconds the claim lasts without renewal.
        limit: the most instances to claim.
        at: the current time (epoch seconds); defaults to now on the database's clock.
        labels: the worker's labels (``runner.labels.canonical``; ``None``: none): only
            instances whose ``runs_on`` they cover are claimed, inside the statement.
        refused: when given, the number of claims a pool, rate or flow limit undid is
            appended to it (the worker then stops claiming ahead for a while).
        standby: how many standbys (claims with no seat, started in a seat one of the
            worker's own attempts hands on as it ends) it may hold per pool besides one
            per seat this claim gives (``pool_settle.settle``), at most
            ``standby_most`` in all; ``None``: none.
        filled: when given, the names of the pools and flow limits this claim left with
            no slot free are appended to it (``pool_settle.settle``).

    Returns the claims to run, highest priority first, then oldest due. No attempt row is
    written here: the instance row records the running attempt (``running_attempt``, ``locked_by``,
    ``state_attempted``) until its row is written at the end. An instance whose attempt a
    dead worker left running is not claimed until :func:`recover_lost` has recorded it.
    The pool limits are kept here, in the claim's transaction (``runner.store.pools``):
    a claim of a pooled state that does not fit is undone and its instance waits.
    """
    hot = hot_for(conn)
    at = hot.clock.now() if at is None else at
    params = {"at": at, "n": limit, "w": worker_id, "until": at + lease, "labels": labels or "{}"}
    claim = hot.claim
    if hot.claim_seated is not None and (seated := seated_json()) is not None:
        claim, params["seats"] = hot.claim_seated, seated  # the claim records the seats
    rows = claim.fetch(conn, params)
    seats: dict[int, Seat] = {}
    ask = None
    if standby is not None:
        ask = StandbyAsk(standby, worker_id, at + lease, labels or "{}", limit, standby_most)
    if rows and any(r[13] is not None or seat_of(conn, r[2], r[3]) for r in rows):
        asked = len(rows)
        rows, seats = settle(conn, rows, at, ask, filled)  # the pool limits, in this transaction
        if refused is not None:
            # (a swap for a waiter is not one; a claim that made standbys claimed ahead
            # to some use: the worker goes on claiming ahead)
            made = any(s.standby for s in seats.values())
            refused.append(0 if made else asked - len(rows))
    elif ask is not None and ask.budget and ask.most and len(rows) < limit:  # standbys only
        rows = [*rows, *standbys(conn, ask, limit - len(rows), at, seats)]
    load = hot.load_json
    sleeping = [r[0] for r in rows if r[12] == "sleeping"]
    if sleeping:  # due after its backoff: it runs now (lifecycle's "wake")
        hot.wake.executemany(conn, [{"ids": hot.dialect.ids_value(sleeping)}])
    return [
        Claim(
            id=r[0],
            flow=r[1],
            version=r[2],
            state=r[3],
            data=load(r[4]) or {},
            fence=r[5],
            attempt=r[6],
            errors=r[7],
            restarts=r[8],
            state_errors=list(load(r[9]) or []),
            state_restarts=r[10],
            event_id=r[11],
            started_at=at,
            pool=_seat_pool(seats.get(r[0])),
            pool_slots=seats[r[0]].slots if r[0] in seats and seats[r[0]].pool else 0,
            standby_pool=seats[r[0]].pool if r[0] in seats and seats[r[0]].standby else None,
            pool_rated=r[0] in seats and seats[r[0]].pool_rated,
            priority=r[15],
            pinned=r[16] is not None,
            limit=seats[r[0]].holds if r[0] in seats else None,
            runs_on=r[18],
            route_event=decode_event(r[19]),
        )
        for r in sorted(rows, key=_claim_order)
    ]


def _seat_pool(seat: Seat | None) -> str | None:
    """The pool whose seat a kept claim holds (none for a standby)."""
    return None if seat is None or seat.standby else seat.pool


def decode_event(text: str | bytes | None) -> dict[str, Any] | None:
    """A stored ``route_event`` (JSON text) as a dict; ``None`` for none."""
    return json.loads(text) if text else None


def _claim_order(r: Any) -> tuple[int, float]:
    """A claimed row's place: highest priority first, then earliest due (``RETURNING``
    keeps no order)."""
    return (-r[15], r[14] or 0.0)


@dataclass
class Lost:
    """An attempt a dead worker left running, as :func:`recover_lost` recorded it."""

    instance_id: int
    attempt: int
    worker: str
    failed: bool  # its restarts were spent: the instance is now ``failed``
    flow: str = field(default="", compare=False)  # for the log line
    state: str = field(default="", compare=False)


def may_recover(conn: Connection) -> bool:
    """Whether :func:`recover_lost`, ``pools.sweep`` or ``routing.sweep`` could find
    anything: some instance is locked (a lease that may have lapsed, a holder that may
    be dead), holds a pool's seat, waits for a pool or waits for a worker with labels.
    Index reads only (``ix_instances_locked_by``, the pools' and ``runs_on``'s partial
    indexes); False on an idle database."""
    return bool(conn.execute(_may_recover()).scalar())


@cache
def _may_recover() -> Select[Any]:
    """:func:`may_recover`'s statement (one ``EXISTS`` an index each), built once."""
    i = instances.c
    wheres = (
        i.locked_by > "",
        i.pool.is_not(None),
        i.waiting_for.is_not(None),
        i.runs_on > "",  # ``routing.sweep``'s (terminal rows keep none, or "")
    )
    return select(or_(*(exists().where(where) for where in wheres)))


def recover_lost(
    conn: Connection,
    policy_of: Callable[[str, str], Policy | None],
    at: float | None = None,
    *,
    me: str = "",
) -> list[Lost]:
    """Record every attempt whose worker stopped renewing its lease, or whose worker is
    provably dead, as ``lost``.

    Such an instance still names its attempt in ``running_attempt`` while its lease
    (``locked_until``) has expired: its worker died (or was stopped) mid-attempt. A
    worker of this host and boot whose process is gone (``runner.store.dead``; ``me`` is
    the caller's worker id, never judged) loses its attempts at once, lease or not, and
    its claims not started yet are unlocked. The attempt row is written with outcome
    ``lost`` and the fault model decides the rest (``runner.flowspec.faults.restart``,
    as for a timeout): the instance counts one restart (its state's too) and is unlocked,
    due at once, so the next claim restarts it from the data as last checkpointed
    (majordomo's restart of lost work); past the state's ``max_restarts`` (of
    ``policy_of(version, state)``, the state's ``Policy``, ``None`` when unknown: none
    allowed) it becomes ``failed`` instead.

    Runs in the caller's transaction; on PostgreSQL the rows are locked ``SKIP LOCKED``,
    so two daemons never record the same attempt twice. Paused and killed instances are
    left to the operator commands (``runner.ops.commands``), which close their attempts.
    """
    at = db_now(conn) if at is None else at
    i = instances.c
    q = select(
        i.id,
        i.flow,
        i.running_attempt,
        i.locked_by,
        i.state,
        i.fence,
        i.state_attempted,
        i.version,
        i.state_restarts,
        i.status,
    ).where(
        # ``> ''`` rather than IS NOT NULL: it reads ix_instances_locked_by (the rows
        # locked now, a few per worker) on SQLite too; the status is checked below, since
        # naming it in the query makes SQLite scan ix_instances_claim instead
        i.locked_by > "",
        i.running_attempt.is_not(None),
    )
    dead = dead_holders(conn, instances, me)
    expired = i.locked_until < at
    q = q.where(or_(expired, i.locked_by.in_(dead)) if dead else expired)
    if dialect_of(conn).skip_locked:
        q = q.with_for_update(skip_locked=True)
    if dead:  # the claims a dead worker had not started yet: free at once
        conn.execute(
            update(instances)
            .where(i.locked_by.in_(dead), i.running_attempt.is_(None))
            .values(locked_by=None, locked_until=None, fence=i.fence + 1)
        )
    found: list[Lost] = []
    rows = []
    for r in conn.execute(q).mappings().all():
        if r["status"] not in CLAIMABLE:
            continue
        why = "died" if r["locked_by"] in dead else "stopped renewing its lease"
        error = f"lost: worker {r['locked_by']} {why} mid-attempt"
        rows.append(running_attempt_row(r, at, "lost", error))
        verdict = faults.restart(
            policy_of(r["version"], r["state"]),
            [],  # the error times are not read: a restart keeps them
            r["state_restarts"],
            at,
            error,
            status=r["status"],
        )
        values: dict[str, Any] = {
            "restarts": i.restarts + 1,
            "state_restarts": verdict.state_restarts,
            "fence": i.fence + 1,
            "locked_by": None,
            "locked_until": None,
            "running_attempt": None,
            "updated_at": at,
            "last_error": verdict.reason,
        }
        if verdict.status != r["status"] or verdict.due_at is not None:
            values.update(status=verdict.status, due_at=verdict.due_at)
        failed = verdict.event == "fail"
        conn.execute(update(instances).where(i.id == r["id"]).values(**values))
        found.append(
            Lost(r["id"], r["running_attempt"], r["locked_by"], failed, r["flow"], r["state"])
        )
    hot_for(conn).close_attempts.executemany(conn, rows)
    emit_lost(conn, found, at)  # lifecycle events, in the same transaction
    return found


def renew(
    conn: Connection, worker_id: str, held: dict[int, int], lease: float, at: float | None = None
) -> list[int]:
    """Extend the lease on every instance in ``held`` (``{instance id: fence}``).

    Returns the ids that are no longer ours as claimed: another worker owns them, or an
    operator command bumped the fence. Their attempts must be cancelled.
    """
    if not held:
        return []
    at = db_now(conn) if at is None else at
    ids = list(held)
    conn.execute(
        update(instances)
        # the owner checked on the rows the ids find, through no index: on PostgreSQL
        # ``ix_instances_locked_by`` holds every row this worker ever held until a vacuum
        .where(instances.c.id.in_(ids), func.coalesce(instances.c.locked_by, "") == worker_id)
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


def release_all(conn: Connection, worker_id: str) -> int:
    """Release every lock ``worker_id`` holds on instances with no attempt running."""
    res = conn.execute(
        update(instances)
        .where(instances.c.locked_by == worker_id, instances.c.running_attempt.is_(None))
        .values(locked_by=None, locked_until=None)
    )
    return res.rowcount or 0
