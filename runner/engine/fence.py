"""Self-fencing: a worker that cannot renew its leases ends its handlers before they run out.

A lease is only safe if its holder stops acting when it can no longer prove it still
holds it: a worker cut off from the database cannot learn that another worker took an
instance over, so it must assume so once the lease it last set has run out. Each attempt
(running, or claimed ahead and waiting) therefore carries a local deadline
(``Running.until``, ``time.monotonic()`` seconds): the end of the lease as this worker set
it, measured from the moment *before* the statement that set it was sent (the claim's
cycle, or the renewal), less :attr:`SelfFence.margin`. At the deadline, unless a renewal
moved it, the attempt is ended: an ``exec`` handler's process group gets SIGTERM and, after
:attr:`SelfFence.grace`, SIGKILL; an async ``call`` handler is cancelled; a sync ``call``
handler is told (``ctx.cancelled``) but cannot be stopped. The attempt is recorded as
``lost`` (one restart) once the database answers again, unless the worker that took the
instance over already recorded it.

Timing: the deadline is ``since + lease - grace - slack``, where ``since`` precedes the
moment the database computed ``locked_until`` (so the database's lease ends no earlier
than ``since + lease`` by this host's clock, up to the two clocks' reading errors,
``runner.store.clock``). The handler gets SIGTERM at the deadline and SIGKILL ``grace``
seconds later, ``slack`` before the lease ends; ``slack`` covers the loop's latency and
the clock readings' errors. See ``docs/design.md`` ("Self-fencing") for what overlap
remains possible.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.engine.running import Running

#: The most seconds kept between a fenced handler's SIGKILL and its lease's end (a tenth
#: of the lease when that is less).
SLACK = 1.0
#: The share of the lease a fenced ``exec`` handler gets between SIGTERM and SIGKILL at
#: most (and never more than the worker's ``kill_grace``).
GRACE_SHARE = 1 / 6


class SelfFence:
    """The local lease deadlines of one worker's attempts (see the module docstring).

    ``lease`` and ``kill_grace`` are the worker's (seconds); ``lapse(run)`` is called on
    the loop for every held attempt (an object with a mutable ``until``) whose deadline
    passed; ``held()`` gives the attempts held now (running and waiting).
    """

    def __init__(
        self,
        lease: float,
        kill_grace: float,
        *,
        held: Callable[[], Iterable[Running]],
        lapse: Callable[[Running], None],
    ) -> None:
        self.lease = lease
        #: seconds between SIGTERM and SIGKILL of a fenced ``exec`` handler
        self.grace = min(kill_grace, lease * GRACE_SHARE)
        #: seconds kept between that SIGKILL and the lease's end
        self.slack = min(SLACK, lease / 10)
        #: how long before its lease ends an attempt is ended (seconds)
        self.margin = self.grace + self.slack
        self._held = held
        self._lapse = lapse
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def deadline(self, since: float) -> float:
        """The deadline (monotonic seconds) of a lease set by a statement sent after
        ``since`` (monotonic seconds)."""
        return since + self.lease - self.margin

    def set(self, runs: Iterable[Running], since: float) -> None:
        """The leases of ``runs`` were set (claimed or renewed) by a statement sent after
        ``since`` (monotonic seconds): move their deadlines (never back) and make sure the
        check runs by the earliest one. Call on the loop."""
        end = self.deadline(since)
        for run in runs:
            if run.until < end:
                run.until = end
        self._arm(end)

    def check(self) -> None:
        """End every held attempt whose deadline passed (``lapse``), then wait for the
        next deadline. Runs on a loop timer, so it needs neither the worker's loop turn
        nor the database (both may be stuck on a dead connection)."""
        self._timer, self._timer_at = None, math.inf
        now = time.monotonic()
        upcoming = math.inf
        for run in list(self._held()):
            if run.until <= now:
                run.until = math.inf  # ended once: never again, never renewed
                self._lapse(run)
            elif run.until < upcoming:
                upcoming = run.until
        if upcoming < math.inf:
            self._arm(upcoming)

    def close(self) -> None:
        """Stop checking (the worker is done)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    def _arm(self, at: float) -> None:
        """Run :meth:`check` at ``at`` (monotonic seconds) unless it runs earlier anyway
        (that run arms the next)."""
        if at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, at - time.monotonic()), self.check)
        self._timer_at = at
