"""The worker loop's periodic chores besides the database cycle, each on its own timer.

One responsibility: what the loop does every so often while it runs. The running (and
waiting) attempts' fences are checked every ``fence_poll`` seconds (an instance taken away
by an operator command or another worker: that attempt is cancelled) and their leases
renewed every third of the lease (``running.RunningAttempts.lease_check``); the worker's
heartbeat row is beaten every ``heartbeat`` seconds; with ``--exit-when-idle`` the
database is asked every 0.2 s, once the worker is quiet, whether anything is left.
Timers are :class:`timers.LoopingTimer` objects (monotonic seconds).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Engine

from runner.engine import cycle
from runner.engine.config import WorkerConfig
from runner.engine.db_thread import DatabaseThread
from runner.engine.running import RunningAttempts
from runner.engine.timers import LoopingTimer
from runner.store import heartbeat

log = logging.getLogger("flowrun.worker")


class Chores:
    """The chores of one worker over ``engine`` (its ``config``, its ``attempts`` in
    progress, its database thread ``db``). ``idle_hint`` is the worker's: a callable
    returning True while something outside the instance table may still create work."""

    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig,
        attempts: RunningAttempts,
        db: DatabaseThread,
        idle_hint: Callable[[], bool] | None,
    ) -> None:
        self.engine, self.config, self.attempts, self.db = engine, config, attempts, db
        self.idle_hint = idle_hint
        self.fence = LoopingTimer(config.fence_poll)  # instances taken away (commands)
        self.renew = LoopingTimer(config.lease / 3)  # the running attempts' leases
        #: seconds between this worker's heartbeats (recorded in its ``workers`` row)
        self.heartbeat = config.heartbeat or heartbeat.heartbeat_interval(config.lease)
        self.beat = LoopingTimer(self.heartbeat)  # this worker's heartbeat row
        self.idle_check = LoopingTimer(0.2)  # --exit-when-idle: anything left anywhere?

    def renew_due(self, now: float) -> bool:
        """True when the leases are due for renewal at ``now`` (monotonic s) and attempts
        hold leases: a loop busy with cycles must still renew them."""
        return self.renew.due(now) and bool(self.attempts.running or self.attempts.waiting)

    async def run(self, now: float) -> None:
        """Check fences (and renew leases) of the running attempts and beat the
        heartbeat, each when its timer is due at ``now`` (monotonic seconds). A database
        error is counted by the database thread (``guard``), not raised."""
        attempts, cfg = self.attempts, self.config
        held = attempts.running or attempts.waiting
        if held and (self.fence.due(now) or self.renew.due(now)):
            check = attempts.lease_check(renew=self.renew.check(now), lease=cfg.lease)
            checked = await self.db.guard(check)
            if checked is not None:
                attempts.lease_checked(checked)
            self.fence.restart(now)
        if self.beat.check(now):
            await self.db.guard(heartbeat.beat, self.engine, cfg.worker_id, len(attempts.running))

    async def idle_exit(self, now: float, quiet: bool) -> bool:
        """``--exit-when-idle``: True when the worker is ``quiet`` (nothing in flight,
        running, waiting or finished) and nothing is pending anywhere in the database or
        hinted at (looked at every 0.2 s)."""
        if not quiet:
            return False
        if not self.idle_check.check(now):
            return False
        if await self.db.guard(self._nothing_left):
            log.info("nothing runnable, due, running or pending: exiting")
            return True
        return False

    def _nothing_left(self) -> bool:
        hint = self.idle_hint
        return (hint is None or not hint()) and cycle.nothing_pending(self.engine)
