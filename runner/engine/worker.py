"""The worker loop: claim due instances, run their handlers, commit the outcomes.

A reconciliation loop after Takahē's Stator: there is no queue, only rows that are due.
Each turn of the loop is one transaction that commits every finished attempt (fenced) and
claims as many due instances as there are free slots (``--concurrency``), and on
PostgreSQL a few more while attempts end quickly (claimed ahead, ``--prefetch``: they
start the moment a slot frees, see ``ahead``); handlers run concurrently as asyncio
tasks. While attempts run (or wait), their leases are renewed every third of the lease
(one not renewed in time is ended before it runs out: ``fence``, self-fencing),
and every ``fence_poll`` seconds the worker checks whether an operator command (pause,
kill, send) or another worker took an instance away: that attempt is cancelled at once
(process group terminated, coroutine cancelled) and recorded ``cancelled``.

Shutdown (:meth:`Worker.request_stop` once: graceful, twice: abort) is a
``shutdown.Shutdown``: the grace period, the last commits, the abort.

Reading order: :meth:`Worker.run` turns the loop; :meth:`Worker._turn` is one turn, in
named steps (tick, stop, collect, cycle, chores, idle exit, wait), each a short method
below it. The chores (leases, fences, the heartbeat, the idle exit's look) are a
``chores.Chores``, on :class:`timers.LoopingTimer` objects (Takahē's
``stator/runner.py``) like the idle looks and the recovery; the database cycle is
``cycle.run_cycle`` (a ``CycleRequest`` in, a ``CycleResult`` out, counted in
``stats``, a ``cycle.WorkerStats``), run by a ``cycle_runner.CycleRunner`` (where it
runs, and the attempts it commits) when ``pacing.plan`` decides (claim-ahead, batch
waiting, the overlapped second cycle, chaining) with the room a ``claim_room.ClaimRoom``
gives; the idle looks skipped are ``idle_looks.IdleLooks``; the attempts in progress are a
``running.RunningAttempts``; blocking calls go to a ``db_thread.DatabaseThread``; the
options are a ``config.WorkerConfig``; the loop sleeps until a ``wakeup.WakeUp``; it
stops through a ``shutdown.Shutdown``.
:meth:`Worker.run_single_cycle` runs one cycle for tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine import batching
from runner.engine.ahead import WAIT_MAX
from runner.engine.chores import Chores
from runner.engine.claim_room import ClaimRoom
from runner.engine.config import WorkerConfig
from runner.engine.cycle import CycleRequest, CycleResult, WorkerStats
from runner.engine.cycle_log import log_lost
from runner.engine.cycle_runner import CycleRunner
from runner.engine.db_thread import CALL_TIMEOUT, DatabaseThread
from runner.engine.idle_looks import IdleLooks
from runner.engine.pacing import plan
from runner.engine.running import Running, RunningAttempts
from runner.engine.shutdown import Shutdown
from runner.engine.timers import LoopingTimer, OutageBackoff
from runner.engine.wakeup import WakeUp
from runner.handlers import native, reaper
from runner.store import heartbeat
from runner.store.clock import clock_of
from runner.store.dialect import dialect_of

log = logging.getLogger("flowrun.worker")


class Worker:
    """One worker over ``engine``; ``await worker.run()`` until stopped.

    ``idle_hint`` is an optional callable returning True while something outside the
    instance table (a sensor still settling files, unhandled events) may still create
    work; ``--exit-when-idle`` waits for it. ``stats`` (:class:`cycle.WorkerStats`) counts
    what it did; ``first_cycle`` (an ``asyncio.Event``) is set once its first database
    cycle is over (what it claimed started, or it failed).
    """

    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig | None = None,
        *,
        idle_hint: Callable[[], bool] | None = None,
    ):
        self.engine = engine
        self.config = cfg = config or WorkerConfig()
        # a call waiting on the network longer than this is broken off (PostgreSQL)
        timeout = None if dialect_of(engine).in_process else CALL_TIMEOUT
        self._db = DatabaseThread(timeout=timeout)
        self.attempts = RunningAttempts(
            engine,
            cfg.worker_id,
            concurrency=cfg.concurrency,
            kill_grace=cfg.kill_grace,
            in_db=self._db.call,
            lease=cfg.lease,
        )
        self.running = self.attempts.running  # by instance id (the same dict, never replaced)
        self.stats = WorkerStats()
        self.first_cycle = asyncio.Event()
        self._wake = WakeUp(clock_of(engine).now)
        #: the database cycles (one in flight, two on PostgreSQL: ``cycle_runner``) and the
        #: finished attempts they commit
        self.cycles = CycleRunner(
            engine, self.attempts, self._db, overlap=cfg.overlap, timeout=timeout
        )
        self.cycles.on_done = self._wake.set
        self._stop = Shutdown(cfg.grace, self.cycles, self.attempts, self._db)
        self._hold = batching.Hold(cfg.concurrency)  # finished attempts waiting for company
        # how many instances to hold claimed beyond the free slots; by default only where
        # a cycle is a round trip on the database thread (PostgreSQL), not on SQLite,
        # whose cycles run on the loop in a millisecond or two
        default = cfg.concurrency if self.cycles.no_wait is None else 0
        self._room = ClaimRoom(self.attempts, default if cfg.prefetch is None else cfg.prefetch)
        # a waiting claim starts within a second of its claim, with half its lease left
        self.attempts.start_within = min(WAIT_MAX, cfg.lease / 2)
        self._want_claim = True  # claim at once: the last claim was full, or a wake-up
        self._outage = OutageBackoff(self._db.said)  # one outage log for the worker
        # the loop's chores, each due at once, then every interval (seconds)
        # woken through LISTEN/NOTIFY (PostgreSQL): idle looks only as a fallback, and the
        # loop sleeps until the next due time or lease expiry it knows (``_wake.at``)
        self._notified = cfg.listen
        fallback = cfg.lease / 2 if cfg.idle_poll is None else cfg.idle_poll or math.inf
        #: seconds between idle looks for due work when woken by notifications (inf: never)
        self.idle_poll = fallback
        self._probe = LoopingTimer(fallback if self._notified else cfg.poll)  # idle look
        recover_every = fallback if self._notified else min(1.0, cfg.lease / 4)
        self._recover = LoopingTimer(recover_every)  # attempts of dead workers
        # leases, fences, the heartbeat, the idle exit's look
        self._chores = Chores(engine, cfg, self.attempts, self._db, idle_hint)
        # SQLite: idle looks skipped while nobody commits (set up in ``start``)
        self._looks = IdleLooks()

    # -- control -----------------------------------------------------------------------

    def wake(self) -> None:
        """Look for due work now (thread-safe): the next loop turn claims at once."""
        self._wake.poke()

    def notify_due(self, due_at: float | None) -> None:
        """Work is due at ``due_at`` (epoch seconds, UTC; ``None``: now), as a notification
        said; call on the worker's loop. Used with ``WorkerConfig.listen``."""
        self._wake.due(due_at)

    def request_stop(self) -> str:
        """First call: graceful stop; second: abort (``shutdown.Shutdown.request``).
        Returns "graceful" or "abort"."""
        mode = self._stop.request()
        self.wake()
        return mode

    def quiet(self) -> bool:
        """True when no attempt runs, waits or waits to be committed and no cycle is in
        flight: the worker has nothing to do until more work is due."""
        return not (self.cycles.flights or self.running or self.attempts.unsettled())

    @property
    def heartbeat(self) -> float:
        """Seconds between this worker's heartbeats (``WorkerConfig.heartbeat``, else a
        third of the lease, at most ``store.heartbeat.HEARTBEAT_MAX``)."""
        return self._chores.heartbeat

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._stop.stopping

    @property
    def grace_left(self) -> float | None:
        """Seconds left of the stop's grace period (0 once past it), or ``None`` before a
        stop was asked for."""
        deadline = self._stop.grace_deadline
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    @property
    def unreachable(self) -> bool:
        """True while a database over the network (PostgreSQL) did not answer this
        worker's last call, or was down when it stopped: what is left to do at a stop
        should not wait for it. Always False on SQLite (no network to wait on)."""
        return self._db.timeout is not None and (self._db.down or self._stop.down_at_stop)

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Run until stopped (or idle, with ``exit_when_idle``).

        At most one database cycle is in flight at a time, on the loop or the database
        thread, or two on PostgreSQL (``cycle_runner``). A cycle that fails because the
        database went away is retried with backoff, with its finished attempts kept:
        nothing is lost.
        """
        await self._open()
        reaper.start()  # exec handlers' escaped descendants are ended with their attempt
        try:
            while not self._stop.abort and await self._turn():
                pass
        finally:
            try:
                await self._close()
            finally:
                reaper.stop()

    async def _turn(self) -> bool:
        """One turn of the loop; False when the loop is done. The steps, in order:

        tick (the loop is alive: ``config.on_tick``); stop (a graceful stop ends once
        nothing runs); collect (the cycles that ended: start what they claimed); cycle
        (start the next one when there is anything to commit or room to claim, then turn
        again at once; on PostgreSQL a second while one is in flight); chores (leases,
        fences, heartbeat); idle exit; wait (for an attempt to end, a wake-up, or the next
        chore).
        """
        if self.config.on_tick is not None:
            self.config.on_tick()
        now = time.monotonic()
        if self._stop.stopping and self._stop.done(now, self.quiet()):
            return False
        while self.cycles.done():
            await self._collect()
            if self._stop.down_at_stop:
                return False
        if now >= self._wake.at:  # a due time or lease expiry we were told of
            self._recover.next_at = now
        if self._wake.take(now):
            self._want_claim = True
        if self.cycles.can_submit() and self._start_cycle(now):
            if self._chores.renew_due(now):
                await self._chores.run(now)  # a busy loop must still renew its leases
            return True
        await self._chores.run(now)
        if self.config.exit_when_idle and await self._chores.idle_exit(now, self.quiet()):
            return False
        await self._wake.wait(self._timeout())
        return True

    async def run_single_cycle(self) -> CycleResult:
        """Testing entry point (Takahē's ``StatorRunner.run_single_cycle``): one database
        cycle now, on the database thread, then start what it claimed; errors propagate.

        The cycle commits every attempt finished so far, records attempts lost by dead
        workers and claims up to the free slots; the attempts it starts run as tasks on
        the calling loop (``worker.running`` empties as they end). On a database error
        (``DBAPIError``, raised) the finished attempts are kept for the next cycle.
        """
        self.attempts.ended = self._wake.bind()
        result = await self.cycles.run_now(self._request(self._free(), probe=True, recover=True))
        self._took(result)
        return result

    # -- the loop's steps --------------------------------------------------------------

    async def _open(self) -> None:
        """Register this worker (retrying while the database is away); start the WAL
        checkpointer of the no-wait engine (its commits leave checkpoints to that thread)."""
        cfg = self.config
        self.attempts.ended = self._wake.bind()
        try:
            await self._db.retrying(
                heartbeat.register,
                self.engine,
                cfg.worker_id,
                self._chores.heartbeat,
                cfg.labels,
                give_up=lambda: self._stop.abort or self._stop.stopping,
            )
        except DBAPIError:
            if self._stop.abort:
                raise
            log.warning("worker %s stopped before the database came back", cfg.worker_id)
            return  # a stop must not wait for the database
        log.info(
            "worker %s started (concurrency %d, lease %gs; exec handlers: %s)",
            cfg.worker_id,
            cfg.concurrency,
            cfg.lease,
            native.path_in_use(),
        )
        self.cycles.start_wal()
        if not self._notified and self.cycles.no_wait is not None:
            self._looks = IdleLooks.open(self.engine)

    async def _collect(self) -> None:
        """Take the result of the cycle that ended: count it and start what it claimed. On
        a database error its finished attempts go back for the next cycle, after a backoff."""
        try:
            result = self.cycles.collect()
        except DBAPIError as exc:  # its attempts are back: committed with the next cycle
            self.first_cycle.set()
            if self._stop.past_grace():
                self._stop.down_at_stop = True  # stopping, down past the grace: close tries once
                return
            await self._stop.pause(self._outage.fail(exc))
            self._want_claim = True
            return
        self._outage.ok()
        self._took(result)
        self.first_cycle.set()
        # claim again if this claim got all it asked for (more may be due), or if a
        # wake-up came while the cycle was in flight: its claim may have been read
        # before the new work was committed (the wake-up would be lost)
        self._want_claim = self._want_claim or result.claimed_all

    def _start_cycle(self, now: float) -> bool:
        """Start the next database cycle if ``pacing.plan`` says so; True if one started
        (the decision: claim-ahead, batch waiting, the overlapped second cycle, chaining)."""
        a, cycles = self.attempts, self.cycles
        room, release = self._room.room(
            now, self._free(), self.cycles.claiming(), self._stop.stopping
        )
        looks = self._looks
        recover = (
            not self._stop.stopping
            and self._recover.due(now)
            and not looks.held_nothing(self._recover, now)
        )
        probe = (room > 0 and not self._want_claim and self._probe.due(now)) and looks.may_find(
            self._probe, now
        )
        step = plan(  # positional: once a turn
            now,
            room,
            bool(release),
            len(a.finished),
            len(cycles.flights),
            cycles.most,
            self._want_claim,
            probe,
            recover,
            0 if self._stop.stopping else len(self.running),
            self.config.concurrency,
            self._hold.since,
            self._room.filled(now),
        )
        self._hold.since = step.held_since
        # waiting for a batch: the attempts' ends wake the loop only once there are enough
        # free slots (the hold's timer wakes it anyway)
        a.quiet_above = step.quiet_above
        if not step.start:
            return False
        cycles.submit(self._request(step.claim, step.probe, recover, release))
        self._want_claim = step.split  # the second cycle claims the other half
        if step.probe:
            self._probe.restart(now)
            recheck = self._looks.take_recheck()  # a commit rung for may not show yet
            if recheck is not None:
                self._probe.next_at = now + recheck
        if recover:
            self._recover.restart(now)
        return True

    def _rung(self) -> None:
        """A commit (anyone's): look for due work at the next turn."""
        self._probe.next_at = 0.0
        self._wake.set()

    def _timeout(self) -> float:
        """How long the loop may wait (seconds) before its next step is due."""
        cfg = self.config
        if self._hold.since is not None:  # waiting for a batch: only its end is due
            return self._hold.left(time.monotonic())
        if self.cycles.flights:
            timeout = 1.0  # their done-callbacks wake us
        elif not self._stop.stopping and len(self.running) < cfg.concurrency:
            next_at = min(
                self._probe.next_at, self._recover.next_at, self._chores.beat.next_at, self._wake.at
            )
            timeout = max(0.0, next_at - time.monotonic())
        else:
            timeout = cfg.fence_poll
        if self.running or self.attempts.waiting or self.attempts.standby:
            timeout = min(timeout, cfg.fence_poll)
        if cfg.exit_when_idle and self.quiet():  # its look for anything left: a timer too
            timeout = min(timeout, max(0.0, self._chores.idle_check.next_at - time.monotonic()))
        return timeout

    # -- cycles ------------------------------------------------------------------------

    def _free(self) -> int:
        """Free slots for new attempts (none while stopping)."""
        return 0 if self._stop.stopping else self.config.concurrency - len(self.running)

    def _request(
        self,
        free: int,
        probe: bool = False,
        recover: bool = False,
        release: list[Running] | None = None,
    ) -> CycleRequest:
        """The next cycle's :class:`CycleRequest`: every attempt finished so far, with
        ``free`` slots (claims ahead included), giving back ``release`` (waiting
        ``running.Running`` claims)."""
        cfg = self.config
        plan = self._notified or (probe and self._looks.active)
        request = CycleRequest(cfg.worker_id, cfg.lease, free, probe, recover, plan)
        request.labels = cfg.labels
        self._room.ask_standbys(request)
        return self.cycles.request(request, stopping=self._stop.stopping, release=release)

    def _took(self, result: CycleResult) -> None:
        """Count a successful cycle, log the lost attempts it recorded, start its claims."""
        self.stats.add(result)
        log_lost(result.recovered)
        self._room.met(result, time.monotonic())
        if self._notified or self._looks.active:
            self._wake.plan(result.next_due, result.next_expiry)
        found = bool(result.claims or result.chained)
        self._looks.looked(found, result.nothing_held, self._wake.loop, self._rung)
        self.attempts.start(result.chained + result.claims, result.lease_from)

    # -- bookkeeping -------------------------------------------------------------------

    async def _close(self) -> None:
        """The last commits and the sign-off (``shutdown.Shutdown.close``), then free what
        the loop held (cycles, idle looks, the database thread, the attempts)."""
        await self._stop.close(
            self.stats,
            lambda release: self._request(0, release=release),
            self.engine,
            self.config.worker_id,
            self.unreachable,
            self._release,
        )
        log.info("worker %s stopped", self.config.worker_id)

    def _release(self) -> None:
        self.cycles.close()
        self._looks.close(self._wake.loop)
        self._db.shutdown()
        self.attempts.close()
