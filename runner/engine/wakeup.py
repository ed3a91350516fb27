"""What wakes the worker loop: one event, and the next due time it was told of.

The loop (``runner.engine.worker``) sleeps between turns until an attempt ends, a cycle
ends, something local asks it to look for work (a sensor created an instance), a
notification says work is due (PostgreSQL ``LISTEN``), or its next chore is due.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class WakeUp:
    """The worker loop's wake-ups, bound to its event loop by :meth:`bind`.

    ``event`` is set to wake the loop (attempts set it as they end: it is
    ``running.RunningAttempts.ended``); ``poked`` means "look for due work now";
    ``at`` is the earliest due time or lease expiry the worker was told of (monotonic
    seconds; ``inf``: none); ``clock()`` is the time those are given in (epoch seconds:
    the database's clock, ``store.clock``).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.poked = False
        self.at = math.inf

    def bind(self) -> asyncio.Event:
        """Bind to the running loop (once); returns :attr:`event`."""
        if self.event is None:
            self.loop, self.event = asyncio.get_running_loop(), asyncio.Event()
        return self.event

    def poke(self) -> None:
        """Look for due work now (thread-safe)."""
        self.poked = True
        if self.loop is not None and self.event is not None:
            self.loop.call_soon_threadsafe(self.event.set)

    def set(self) -> None:
        """Wake the loop (on the loop)."""
        if self.event is not None:
            self.event.set()

    def due(self, due_at: float | None) -> None:
        """Work is due at ``due_at`` (epoch seconds, UTC; ``None``: now); on the loop."""
        delay = 0.0 if due_at is None else due_at - self.clock()
        if delay <= 0:
            self.poke()
        else:
            self.at = min(self.at, time.monotonic() + delay)
            self.set()  # recompute the wait

    def plan(self, *times: float | None) -> None:
        """Wake no later than each of ``times`` (epoch seconds; ``None``: none)."""
        now, mono = self.clock(), time.monotonic()
        for at in times:
            if at is not None:
                self.at = min(self.at, mono + max(0.0, at - now) + 0.01)

    def take(self, now: float) -> bool:
        """True (once) when a poke or the planned time (at ``now``, monotonic) came."""
        if now >= self.at:
            self.at = math.inf
            self.poked = True
        poked, self.poked = self.poked, False
        return poked

    async def wait(self, timeout: float) -> None:
        """Wait until woken or ``timeout`` seconds passed, then clear the event (a timer
        sets it: ``asyncio.wait_for`` made a task per wait, and a busy ``exec`` worker
        waits once per attempt or more); with no time to wait, let the handlers run."""
        event, loop = self.event, self.loop
        assert event is not None and loop is not None
        if not event.is_set() and timeout > 0:
            timer = loop.call_later(timeout, event.set)
            try:
                await event.wait()
            finally:
                timer.cancel()
        else:
            await asyncio.sleep(0)
        event.clear()
