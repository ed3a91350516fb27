"""The worker's stop: a graceful stop within a grace period, an abort, the last commits.

One responsibility: when and how a :class:`~runner.engine.worker.Worker` stops. Huey's
consumer and Stator's ``runstator``: :meth:`Shutdown.request` once → stop claiming, give
back the claims not started, let running attempts finish within ``grace`` seconds (then
cancel them), release every lock, exit cleanly; twice → abort now: handler process groups
are killed and the attempts still running (or waiting) are left for a worker to record as
``lost`` once their lease has expired (``store.recover_lost``).

The worker's loop asks :meth:`Shutdown.done` each turn while stopping, sleeps an outage's
backoff through :meth:`Shutdown.pause`, and ends with :meth:`Shutdown.close` (the cycles
in flight, the last outcomes, the worker's ``stopped`` heartbeat).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine.cycle import CycleRequest, WorkerStats
from runner.engine.cycle_runner import CycleRunner
from runner.engine.db_thread import HURRY_TIMEOUT, DatabaseThread
from runner.engine.running import Running, RunningAttempts
from runner.store import heartbeat, log_writer

log = logging.getLogger("flowrun.worker")

#: Seconds an abort (a second stop request) still waits for the cycles in flight; what
#: the network holds longer is left behind (the attempts are recovered as lost once their
#: leases expire).
ABANDON_AFTER = 1.0


class Shutdown:
    """The stop of one worker: its state (``stopping``, ``abort``, ``down_at_stop``,
    ``grace_deadline``) and the steps that read it.

    ``grace`` is the seconds running attempts get after the first request; ``cycles``,
    ``attempts`` and ``db`` are the worker's own (its cycle runner, its attempts in
    progress, its database thread).
    """

    def __init__(
        self,
        grace: float,
        cycles: CycleRunner,
        attempts: RunningAttempts,
        db: DatabaseThread,
    ):
        self.grace, self.cycles, self.attempts, self.db = grace, cycles, attempts, db
        self.stopping = self.abort = False
        self.down_at_stop = False  # stopping, and the database down when the grace ran out
        self.grace_deadline: float | None = None  # monotonic s, set by the first request
        self._logged = False

    def request(self) -> str:
        """First call: graceful stop; second: abort. Returns "graceful" or "abort" (the
        caller wakes the loop)."""
        if not self.stopping:
            self.stopping = True
            self.attempts.refill = False  # the claims not started are given back
            now = time.monotonic()
            self.grace_deadline = now + self.grace
            # from the grace's last second on, a call stuck on a dead network is broken
            # off or given up, so that the loop is free when the grace ends
            self.cycles.hurry(max(now, self.grace_deadline - HURRY_TIMEOUT))
            return "graceful"
        self.abort = True
        # a call stuck on a dead network is broken off now, and one that cannot be (a
        # connection attempt) is given up soon: the loop must not wait for either
        self.cycles.hurry(time.monotonic())
        return "abort"

    def past_grace(self) -> bool:
        """True once stopping and the grace period is over."""
        return self.grace_deadline is not None and time.monotonic() > self.grace_deadline

    def done(self, now: float, quiet: bool) -> bool:
        """While stopping, at ``now`` (monotonic s; ``quiet``: nothing runs, waits, is
        finished or in flight): True once the loop may end. Past the grace period
        (``grace`` s after the first request) the running attempts are cancelled."""
        running = self.attempts.running
        if not self._logged:
            self._logged = True
            log.info("stopping: %d attempts running, grace %gs", len(running), self.grace)
        if quiet:
            return True
        deadline = self.grace_deadline
        assert deadline is not None
        if now > deadline:
            self.attempts.cancel_all("worker shutting down (grace period over)")
        # the database (over a network) does not answer in the grace's last second: what
        # is left cannot be committed; leave, once no attempt runs
        if (
            self.db.timeout is not None
            and now > deadline - HURRY_TIMEOUT
            and (now > deadline or not running)
            and (self.db.down or self.cycles.stuck(now, HURRY_TIMEOUT))
        ):
            self.down_at_stop = True
            return True
        return False

    async def pause(self, delay: float) -> None:
        """Sleep ``delay`` seconds (an outage's backoff), cut short when a stop is
        requested or, once stopping, at the end of the grace period."""
        stopping = self.stopping
        end = time.monotonic() + delay
        while not self.abort and stopping == self.stopping:
            left = min(end, self.grace_deadline or end) - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.1))

    async def close(
        self,
        stats: WorkerStats,
        last: Callable[[list[Running]], CycleRequest],
        engine: Engine,
        worker_id: str,
        unreachable: bool,
        release: Callable[[], None],
    ) -> None:
        """The loop ended: wait for the cycles still in flight (keeping the attempts of one
        that failed, counted in ``stats``); then abort, or commit what finished (retrying a
        few times; ``last(release)`` is the cycle request giving back the waiting claims
        ``release``); then sign off (``worker_id``'s heartbeat row on ``engine``) and call
        ``release()`` (free what the loop held). After an abort or past the grace, a
        database that does not answer (``unreachable``) is not waited for. Raises what
        the cycles raise other than ``DBAPIError``."""
        late = self.abort or self.down_at_stop or self.past_grace()
        gone = late and unreachable  # nothing more can be committed: leave now
        for settled in await self.cycles.settle(0 if gone else ABANDON_AFTER if late else None):
            stats.add(settled)
        running = self.attempts.running
        if gone and (writer := log_writer.writer_for(engine)) is not None:
            writer.give_up()  # nor its attempt logs: the exit must not wait for them
        if self.abort or gone:
            self.attempts.abort()
            log.warning(
                "%s: %d attempts left for the next claim to recover",
                "aborted" if self.abort else "stopped with the database unreachable",
                len(running),
            )
        else:
            # the last outcomes; the database may be briefly away (once: it was down for
            # the whole grace already)
            for _ in range(1 if self.down_at_stop else 5):
                if not self.attempts.unsettled():
                    break
                try:
                    given_back = self.attempts.give_back(everything=True)
                    stats.add(await self.cycles.run_now(last(given_back)))
                except DBAPIError as exc:
                    self.db.said.failed(exc, "; retrying at stop")
                    await asyncio.sleep(1.0)

        try:
            if not gone:
                await self.db.guard(
                    heartbeat.stopped, engine, worker_id, len(running), not self.abort
                )
        finally:
            release()
