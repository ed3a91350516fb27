"""The worker's database cycle: one transaction per turn of the worker loop.

One cycle commits the finished attempts (fenced: an attempt whose instance was taken away
by a command or another worker is not committed but reported lost), continues the chained
ones (an instance due again at once keeps its lease, see :func:`decide_finished`), closes
the cancelled ones, gives back claims whose attempts never started (``commit.give_back``),
records the attempts lost by dead workers when asked (``store.recover_lost``), and claims
due instances up to the free slots left (claimed ahead included, ``engine.ahead``).

Where the database serialises writers (SQLite) the commit is optimistic: it does not read
the fences first; if one claim was lost (``commit.FenceMoved``) the transaction rolls back
and commits again the careful way, reading the fences first.

The worker asks for one cycle with a :class:`CycleRequest` (:func:`decide_finished`
fills it from the attempts that finished) and gets a :class:`CycleResult`
(:func:`run_cycle`); it counts results in its :class:`WorkerStats`. These are plain
functions and dataclasses: the loop that calls them (and decides on which thread and
engine) is :class:`runner.engine.worker.Worker`, which this module never imports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from sqlalchemy import Engine, select
from sqlalchemy.exc import DBAPIError

from runner import lifecycle
from runner.engine import seats
from runner.engine.cycle_log import log_ended
from runner.engine.outcomes import decide
from runner.errors import UserError
from runner.flowspec.policy import Policy
from runner.handlers.attempt import AttemptResult
from runner.store import commit, due, leases, pools, routing, versions
from runner.store.clock import db_now
from runner.store.db import reading
from runner.store.db_errors import is_busy
from runner.store.dialect import dialect_of
from runner.store.notify import notify_due
from runner.store.rows import Claim, Outcome
from runner.store.tables import events

if TYPE_CHECKING:
    from runner.engine.running import Running

#: Moves one claim may chain through before its instance is released and claimed anew.
MAX_CHAIN = 16


@dataclass(slots=True)
class CycleRequest:
    """What one cycle is asked to do, for worker ``worker_id`` (leases of ``lease`` s).

    ``outcomes`` (``rows.Outcome``), ``cancels`` (``(rows.Claim, reason)`` pairs) and
    ``chain`` (the outcomes, also in ``outcomes``, that continue without a new claim) are
    filled by :func:`decide_finished`; ``free`` is the worker's free slots and the
    claims it may hold ahead of them (chained instances take theirs first, the claim the
    rest); ``release`` the claims to give back, their attempts never started; ``probe``
    means the worker only
    looks for due work, so an idle cycle first checks cheaply whether anything is due;
    ``recover`` asks it to record the attempts lost by dead workers (``leases.recover_lost``);
    ``plan`` asks, when the claim leaves slots free, when work next appears by itself
    (``due.next_times``: a worker woken by notifications sleeps until then);
    ``labels`` are the worker's (``runner.labels.canonical``): it claims only what they
    cover; ``standby`` how many standbys it may hold per pool (``engine.seats``;
    ``None``: none, it does not claim ahead), ``standby_most`` in all.
    """

    worker_id: str
    lease: float
    free: int = 0
    probe: bool = False
    recover: bool = False
    plan: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    cancels: list[tuple[Claim, str]] = field(default_factory=list)
    chain: list[Outcome] = field(default_factory=list)
    release: list[Claim] = field(default_factory=list)
    labels: str | None = None
    standby: dict[str, int] | None = None
    standby_most: int = 0


@dataclass(slots=True)
class CycleResult:
    """What one cycle did (an idle probe that found nothing due: all empty).

    ``claims``: the instances claimed anew (``rows.Claim``); ``chained``: the claims that
    continue a chained outcome; ``recovered``: the ``leases.Lost`` attempts of dead workers
    it recorded; ``lost``: ids of the instances whose fence moved (their outcomes not
    committed); ``limit``: how many claims it asked for; ``committed`` and ``cancelled``:
    how many finished attempts it committed (cancelled ones included, lost ones not) and
    closed as cancelled.
    """

    claims: list[Claim] = field(default_factory=list)
    chained: list[Claim] = field(default_factory=list)
    recovered: list[leases.Lost] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    limit: int = 0
    committed: int = 0
    cancelled: int = 0
    #: with ``request.plan``: the next due time and lease expiry (epoch s), None if none
    next_due: float | None = None
    next_expiry: float | None = None
    #: claims a pool, rate or flow limit undid (the worker stops claiming ahead a while)
    refused: int = 0
    #: ``time.monotonic()`` before the transaction began: the leases of ``claims`` and
    #: ``chained`` end no earlier than ``lease`` seconds after it (``engine.fence``)
    lease_from: float = 0.0
    #: a look for lost attempts found nothing locked, held or waiting
    #: (``leases.may_recover`` False): until someone commits, the next would find nothing
    nothing_held: bool = False
    #: standbys running in a seat whose hand-off turned out void (``engine.seats.plan``)
    unseated: list[Claim] = field(default_factory=list)
    #: seats it recorded as handed on to a standby (void ones not counted)
    handed: int = 0
    #: its claim left a pool or a flow limit with no slot free (``pacing``: no split)
    filled: bool = False

    @property
    def claimed_all(self) -> bool:
        """The claim got every instance it asked for: more may be due (claim again now)."""
        return self.limit > 0 and len(self.claims) == self.limit


@dataclass(slots=True)
class WorkerStats:
    """What one worker did since it started (the daemon's exit line); counters only grow.

    ``claimed``: instances claimed from the table; ``chained``: attempts continued without
    a new claim; ``committed``: finished attempts committed (cancelled ones included);
    ``cancelled``: attempts closed as cancelled; ``lost_fence``: finished attempts not
    committed because their instance was taken away (a command, or another worker).
    Updated on the worker's event loop only; plain ``int`` reads from any thread are safe.
    """

    claimed: int = 0
    chained: int = 0
    committed: int = 0
    cancelled: int = 0
    lost_fence: int = 0
    recovered: int = 0  # attempts of dead workers this worker recorded as lost
    handed: int = 0  # pool seats handed from an ended attempt to a standby (``engine.seats``)

    def add(self, result: CycleResult) -> None:
        """Count what one successful cycle did."""
        self.claimed += len(result.claims)
        self.chained += len(result.chained)
        self.committed += result.committed
        self.cancelled += result.cancelled
        self.lost_fence += len(result.lost)
        self.recovered += len(result.recovered)
        self.handed += result.handed

    def items(self) -> list[tuple[str, int]]:
        """``(name, count)`` pairs in field order (the exit line, metrics)."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def decide_finished(
    engine: Engine,
    batch: Sequence[tuple[Running, AttemptResult]],
    request: CycleRequest,
    *,
    stopping: bool,
) -> CycleRequest:
    """Fill ``request`` with what to do with ``batch`` and return it: the outcomes to
    commit, the attempts to close as cancelled, and which outcomes chain.

    ``batch`` holds ``(run, result)`` pairs of finished attempts, where ``run`` has the
    attempt's ``claim`` (``rows.Claim``) and ``durable`` (a one-item list: its data as
    last stored); chaining takes at most ``request.free`` slots; ``stopping`` (a stop was
    requested) turns chaining off; ``engine`` reads the compiled flow versions. Every
    pair lands in ``request.outcomes`` or ``request.cancels`` (a stored definition that
    no longer compiles cancels its attempt).

    An instance due again at once (it moved to a runnable state, or its retry has no
    backoff) continues in this worker
    without being released and claimed again (at most ``MAX_CHAIN`` moves per claim,
    so one instance cannot hold a slot forever).
    """
    outcomes, cancels, chain = request.outcomes, request.cancels, request.chain
    free = request.free
    at = db_now(engine)
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
            # a chained attempt keeps its claim's pool slots: only into a state holding
            # the same (``store.pools``: slots are taken by claims, given back at the end),
            # and never into a start a rate counts (the claim counts them)
            and not run.claim.pool_rated
            and run.claim.seat_to is None  # its seat went to a standby
            and _seat(flow, v["state"]) == (run.claim.pool, run.claim.pool_slots)
            # a chained commit writes no priority: only where the row's stays
            and run.claim.keeps_priority(v.get("priority"))
            # nor its requirement: the next state's runs_on may need another worker
            and run.claim.keeps_route(v)
        ):  # due again at once (a move, or a retry with no backoff): keep the lease
            if v["status"] == "sleeping":
                v["status"] = lifecycle.check("sleeping", "wake")
            chain.append(outcome)
            outcome.chain = True
    return request


def _seat(flow, state: str) -> tuple[str | None, int]:
    """The pool and slots an attempt in ``state`` of ``flow`` holds (``(None, 0)``: none;
    ``("", -1)``, equal to no claim's, for a state with a rate of its own)."""
    st = flow.states.get(state)
    if st is not None and getattr(st, "rate", None) is not None:
        return ("", -1)
    return (None, 0) if st is None or st.pool is None else (st.pool, st.slots)


def run_cycle(engine: Engine, request: CycleRequest) -> CycleResult:
    """One transaction on ``engine``: commit finished attempts (fenced), continue the
    chained ones, close cancelled ones, record attempts lost by dead workers (when
    ``request.recover``), and claim up to the free slots left.

    An idle probe (``request.probe`` with nothing to commit or recover) first reads
    whether anything is due and returns an empty :class:`CycleResult` when nothing is.
    Raises ``DBAPIError`` when the database fails (nothing was committed).

    Where the database serialises writers (SQLite) the commit is optimistic: it does
    not read the fences first; if one claim was lost it rolls back and commits again
    the careful way."""
    outcomes, cancels = request.outcomes, request.cancels
    limit = max(0, request.free - len(request.chain))
    if (request.probe or request.recover) and not (outcomes or cancels or request.release):
        # an idle look, or a look for lost attempts with nothing locked, held or waiting
        # (``leases.may_recover``): a read; the write transaction only to claim what is due
        idle = _idle_probe(engine, request.plan, request.labels, request.recover, request.probe)
        if idle is not None:
            return idle
    try:
        result = _transaction(engine, request, limit, True)
    except commit.FenceMoved:  # rolled back: commit again, reading the fences first
        result = _transaction(engine, request, limit, False)
    log_ended(engine, request, result.lost)
    result.committed = len(outcomes) + len(cancels) - len(result.lost)
    result.cancelled = len(cancels)
    return result


def run_inline(
    loop: asyncio.AbstractEventLoop, no_wait: Engine, request: CycleRequest
) -> asyncio.Future[CycleResult] | None:
    """Run one cycle right now, on the calling thread (the worker's loop), through
    ``no_wait`` (an engine that never waits for the SQLite write lock,
    ``db.no_wait_engine``); returns a future already done (its :class:`CycleResult`, or
    the database error), or ``None`` when the write lock is taken (the caller uses the
    database thread)."""
    fut = loop.create_future()
    try:
        fut.set_result(run_cycle(no_wait, request))
    except DBAPIError as exc:
        if is_busy(exc):
            return None
        fut.set_exception(exc)
    return fut


def _transaction(
    engine: Engine, request: CycleRequest, limit: int, optimistic: bool
) -> CycleResult:
    """The cycle's transaction itself (claims, chained, recovered, lost and, with
    ``request.plan`` when it claimed nothing or looked for lost attempts, the next times);
    ``optimistic`` skips reading the fences first (``commit.FenceMoved`` then means:
    rolled back, try again without)."""
    worker_id, lease = request.worker_id, request.lease
    since = time.monotonic()
    with engine.begin() as conn:
        leases.by_index(conn)  # PostgreSQL: the cycle's statements plan by index only
        lost, chained = commit.commit_outcomes(
            conn, worker_id, request.outcomes, lease=lease, optimistic=optimistic
        )
        for claim, why in request.cancels:
            commit.cancel_attempt(conn, worker_id, claim, why)
        if request.release:
            commit.give_back(conn, worker_id, request.release)
        ended = [o.claim for o in request.outcomes if not o.chain]
        gone = set(lost)
        cleared = {o.claim.id for o in request.outcomes if o.seat_freed and o.claim.id not in gone}
        closed = [*ended, *(c for c, _ in request.cancels)]
        handed = seats.plan(closed, gone)
        pools.hold_handed(conn, handed.hold)
        released = [*closed, *request.release]
        woken = pools.release(conn, released, cleared=cleared, skip=handed.skip)
        recovered = []
        if request.recover:
            recovered = leases.recover_lost(conn, lambda v, s: _policy(conn, v, s), me=worker_id)
            pools.sweep(conn, db_now(conn))
            routing.sweep(conn, db_now(conn))
        claims: list[Claim] = []
        refused: list[int] = []
        filled: list[str] = []
        if limit > 0:
            claims = leases.claim_batch(
                conn,
                worker_id,
                lease,
                limit,
                labels=request.labels,
                refused=refused,
                standby=request.standby,
                standby_most=request.standby_most,
                filled=filled,
            )
        if woken and not set(woken) <= {c.id for c in claims}:
            notify_due(conn)  # waiters woken above that this claim did not take
        result = CycleResult(claims, chained, recovered, lost, limit, lease_from=since)
        result.unseated, result.handed = handed.unseated, handed.count
        result.refused, result.filled = sum(refused), bool(filled)
        plan = request.plan and (request.recover or not (claims or chained))
        # PostgreSQL: a claim the limits settled (``refused`` filled) holds a pool's or
        # a rate's row locked to the commit, and every claim of that pool waits for it:
        # plan after the commit, in a read of its own
        later = plan and bool(refused) and dialect_of(engine).skip_locked
        if plan and not later:
            result.next_due, result.next_expiry = due.next_times(conn, db_now(conn))
    if later:
        with reading(engine) as conn:
            result.next_due, result.next_expiry = due.next_times(conn, db_now(conn))
    return result


def _idle_probe(
    engine: Engine,
    plan: bool,
    labels: str | None = None,
    recover: bool = False,
    probe: bool = True,
) -> CycleResult | None:
    """A cheap read before an idle look's write transaction: ``None`` when, with
    ``probe``, something a worker with ``labels`` may claim is due now (claim it) or,
    with ``recover``, lost attempts may be found (``leases.may_recover``), else an
    empty :class:`CycleResult`, which with ``plan`` says when work next appears by
    itself (``due.next_times``), read in the same snapshot. A look for lost attempts
    alone (no ``probe``) does not look for due work: the worker's idle probe does, when
    it may find some."""
    with reading(engine) as conn:
        if recover and leases.may_recover(conn):
            return None
        at = db_now(conn)
        if probe and due.has_due(conn, at, labels):
            return None
        result = CycleResult(nothing_held=recover)
        if plan:
            result.next_due, result.next_expiry = due.next_times(conn, at)
        return result


def nothing_pending(engine: Engine) -> bool:
    """True when no instance has work left (``due.busy_count``: due, or an attempt
    running under a valid lease) and no event awaits handling (``--exit-when-idle``); a
    read on ``engine``, run on the worker's database thread."""
    with reading(engine) as conn:
        if due.busy_count(conn):
            return False
        pending = conn.execute(select(events.c.id).where(events.c.handled_at.is_(None)).limit(1))
        return pending.first() is None


def _policy(conn, version: str, state: str) -> Policy | None:
    """The ``Policy`` of ``state`` in flow ``version``; ``None`` if it no longer compiles."""
    try:
        return versions.compiled(conn, version).states[state].policy
    except (UserError, KeyError):
        return None
