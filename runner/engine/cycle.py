"""The worker's database cycle: one transaction per turn of the worker loop.

One cycle commits the finished attempts (fenced: an attempt whose instance was taken away
by a command or another worker is not committed but reported lost), continues the chained
ones (an instance due again at once keeps its lease, see :func:`decide_finished`), closes
the cancelled ones, records the attempts lost by dead workers when asked
(``store.recover_lost``), and claims due instances up to the free slots left.

Where the database serialises writers (SQLite) the commit is optimistic: it does not read
the fences first; if one claim was lost (``commit.FenceMoved``) the transaction rolls back
and commits again the careful way, reading the fences first.

These are plain functions over explicit arguments: the loop that calls them (and decides
on which thread and engine) is :class:`runner.engine.worker.Worker`, which this module never
imports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import DBAPIError

from runner import lifecycle
from runner.engine.outcomes import decide
from runner.errors import UserError
from runner.handlers.attempt import AttemptResult
from runner.store import commit, leases, versions
from runner.store.db import is_busy, reading, short_error
from runner.store.tables import events, instances

log = logging.getLogger("flowrun.worker")  # the worker's own log: these are its messages

#: Moves one claim may chain through before its instance is released and claimed anew.
MAX_CHAIN = 16

#: What one cycle returns: ``(claims, chained, recovered, lost, limit)``.
CycleResult = tuple[list, list, list, list, int]


def decide_finished(
    engine: Engine, batch: Sequence[tuple[Any, AttemptResult]], free: int, stopping: bool
) -> tuple[list, list, list]:
    """Outcomes to commit, attempts to close as cancelled, and which outcomes chain.

    ``batch`` holds ``(run, result)`` pairs of finished attempts, where ``run`` has the
    attempt's ``claim`` (``rows.Claim``) and ``durable`` (a one-item list: its data as
    last stored); ``free`` is how many slots the worker has left for chained instances;
    ``stopping`` (a stop was requested) turns chaining off; ``engine`` reads the compiled
    flow versions. Returns ``(outcomes, cancels, chain)``: the ``rows.Outcome`` list to
    commit, ``(claim, reason)`` pairs to close as cancelled, and the outcomes (also in
    ``outcomes``) that chain.

    An instance due again at once (it moved to a runnable state, or its retry has no
    backoff) continues in this worker
    without being released and claimed again (at most ``MAX_CHAIN`` moves per claim,
    so one instance cannot hold a slot forever).
    """
    outcomes, cancels, chain = [], [], []
    at = time.time()
    for run, result in batch:
        if result.outcome == "cancelled":
            cancels.append((run.claim, result.error or "cancelled"))
            continue
        try:
            flow = versions.compiled(engine, run.claim.version)
        except UserError as exc:  # the stored definition no longer compiles
            cancels.append((run.claim, str(exc)))
            continue
        outcome = decide(flow, run.claim, result, run.durable[0], at)
        outcomes.append(outcome)
        v = outcome.values
        if (
            not stopping
            and v["status"] in ("runnable", "sleeping")
            and v["due_at"] is not None
            and v["due_at"] <= at
            and run.claim.chain < MAX_CHAIN
            and len(chain) < free
        ):  # due again at once (a move, or a retry with no backoff): keep the lease
            if v["status"] == "sleeping":
                v["status"] = lifecycle.check("sleeping", "wake")
            chain.append(outcome)
            outcome.chain = True
    return outcomes, cancels, chain


def run_cycle(
    engine: Engine,
    worker_id: str,
    lease: float,
    stats: dict[str, int],
    outcomes: list,
    cancels: list,
    chain: list,
    free: int,
    probe: bool,
    recover: bool,
) -> CycleResult:
    """One transaction: commit finished attempts (fenced), continue the chained ones,
    close cancelled ones, record attempts lost by dead workers (when ``recover``), and
    claim up to the free slots left.

    ``outcomes``, ``cancels`` and ``chain`` are what :func:`decide_finished` returned;
    ``free`` is the worker's free slots (chained instances take theirs first); ``probe``
    means the worker only looks for due work, so an idle cycle first checks cheaply
    whether anything is due; ``lease`` is in seconds; ``stats`` (the worker's counters:
    ``claimed``, ``chained``, ``cancelled``) is updated in place. Returns
    ``(claims, chained, recovered, lost, limit)``: the new ``rows.Claim`` list, the
    chained claims to continue, the ``leases.Lost`` attempts recovered, the ids of the
    instances whose fence moved (their outcomes not committed), and how many claims were
    asked for (``limit``, 0 when an idle probe found nothing due).

    Where the database serialises writers (SQLite) the commit is optimistic: it does
    not read the fences first; if one claim was lost it rolls back and commits again
    the careful way."""
    limit = max(0, free - len(chain))
    if probe and not recover and not outcomes and not cancels and not _has_due(engine):
        return [], [], [], [], 0
    try:
        claims, chained, recovered, lost = _transaction(
            engine, worker_id, lease, outcomes, cancels, limit, recover, True
        )
    except commit.FenceMoved:  # rolled back: commit again, reading the fences first
        claims, chained, recovered, lost = _transaction(
            engine, worker_id, lease, outcomes, cancels, limit, recover, False
        )
    stats["claimed"] += len(claims)
    stats["chained"] += len(chained)
    stats["cancelled"] += len(cancels)
    if recovered:
        stats["recovered"] = stats.get("recovered", 0) + len(recovered)
    if lost:
        log_fenced(engine, worker_id, lost)
    return claims, chained, recovered, lost, limit


def log_fenced(engine: Engine, worker_id: str, lost: Sequence[int]) -> None:
    """One WARNING per holder for outcomes the fence refused (``lost``: instance ids
    taken away by a command or another worker), naming who holds them now."""
    try:
        with reading(engine) as conn:
            rows = conn.execute(
                select(instances.c.id, instances.c.locked_by).where(instances.c.id.in_(lost))
            ).all()
    except DBAPIError:
        rows = []
    holders = {iid: holder for iid, holder in rows}
    by_holder: dict[str, list[int]] = {}
    for iid in lost:
        by_holder.setdefault(holders.get(iid) or "nobody (released)", []).append(iid)
    for holder, ids in by_holder.items():
        log.warning(
            "fenced out: outcome of instances %s not committed by %s; held now by %s",
            ", ".join(map(str, ids)),
            worker_id,
            holder,
            extra={"instances": ids, "worker": worker_id, "holder": holder},
        )


def run_inline(
    loop: asyncio.AbstractEventLoop, no_wait: Engine, context: tuple, args: tuple
) -> asyncio.Future | None:
    """Run one cycle right now, on the calling thread (the worker's loop), through
    ``no_wait`` (an engine that never waits for the SQLite write lock,
    ``db.no_wait_engine``); returns a future already done (its result, or the database
    error), or ``None`` when the write lock is taken (the caller uses the database thread).

    ``context`` is ``(worker_id, lease, stats)`` and ``args`` is ``(outcomes, cancels,
    chain, free, probe, recover)``, as taken by :func:`run_cycle` after its engine."""
    fut = loop.create_future()
    try:
        fut.set_result(run_cycle(no_wait, *context, *args))
    except DBAPIError as exc:
        if is_busy(exc):
            return None
        fut.set_exception(exc)
    return fut


def _transaction(
    engine: Engine,
    worker_id: str,
    lease: float,
    outcomes: list,
    cancels: list,
    limit: int,
    recover: bool,
    optimistic: bool,
) -> tuple[list, list, list, list]:
    """The cycle's transaction itself; ``optimistic`` skips reading the fences first
    (``commit.FenceMoved`` then means: rolled back, try again without)."""
    with engine.begin() as conn:
        lost, chained = commit.commit_outcomes(
            conn, worker_id, outcomes, lease=lease, optimistic=optimistic
        )
        for claim, why in cancels:
            commit.cancel_attempt(conn, worker_id, claim, why)
        recovered = []
        if recover:
            recovered = leases.recover_lost(conn, lambda v, s: _max_restarts(conn, v, s))
        claims = []
        if limit > 0:
            claims = leases.claim_batch(conn, worker_id, lease, limit)
    return claims, chained, recovered, lost


def _has_due(engine: Engine) -> bool:
    """Whether any instance is due now (a cheap read before an idle probe's transaction)."""
    with reading(engine) as conn:
        return leases.has_due(conn, time.time())


def nothing_pending(engine: Engine) -> bool:
    """True when no instance has work left (``store.busy_count``: due, or an attempt
    running under a valid lease) and no event awaits handling (``--exit-when-idle``); a
    read on ``engine``, run on the worker's database thread."""
    with reading(engine) as conn:
        if leases.busy_count(conn):
            return False
        pending = conn.execute(select(events.c.id).where(events.c.handled_at.is_(None)).limit(1))
        return pending.first() is None


class OutageBackoff:
    """Exponential backoff for database outages: 0.5 s doubling to 2 s (a retry every
    2 s costs the database nothing, and work resumes within 2 s of its return).

    ``fail(exc)`` counts one more failure, logs the outage (``exc``: the database error;
    the first failure, then at most every 30 s) and returns the delay in seconds before
    the next try; ``ok()`` resets the count, logging that the database is back if it had
    failed; ``failures`` is the count since the last success."""

    CAP = 2.0
    QUIET = 30.0

    def __init__(self) -> None:
        self.failures = 0
        self._logged = 0.0

    def fail(self, exc: BaseException) -> float:
        self.failures += 1
        delay = min(self.CAP, 0.5 * 2 ** (self.failures - 1))
        now = time.monotonic()
        if self.failures == 1 or now - self._logged >= self.QUIET:
            self._logged = now
            log.warning(
                "database unavailable (%s); retrying every %.1fs (%d failures)",
                short_error(exc),
                delay,
                self.failures,
            )
        return delay

    def ok(self) -> None:
        if self.failures:
            log.warning("database reachable again")
        self.failures = 0


def log_lost(recovered: list[leases.Lost]) -> None:
    """Log each attempt a cycle recorded as lost by a dead worker (``leases.Lost`` list)."""
    for lost in recovered:
        log.warning(
            "instance %d: attempt lost by worker %s (attempt %d); %s",
            lost.instance_id,
            lost.worker,
            lost.attempt,
            "restarts spent: instance failed"
            if lost.failed
            else "restarting from its last checkpoint",
            extra={"instance": lost.instance_id, "worker": lost.worker, "attempt": lost.attempt},
        )


def _max_restarts(conn, version: str, state: str) -> int:
    """The ``max_restarts`` of ``state`` in flow ``version``; 0 if it no longer compiles."""
    try:
        return versions.compiled(conn, version).states[state].policy.max_restarts
    except (UserError, KeyError):
        return 0
