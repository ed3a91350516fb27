"""The worker's first cycle as a gate: the daemon's parts that can start later wait for it.

One responsibility: a part wrapped in :meth:`FirstCycle.later` (the listener, the status
line, the progress, the pruner) and the sensor hub (:meth:`FirstCycle.quiet`) start only
once the worker's first database cycle is over, so the first claim does not wait for their
connections, imports or CPU; the daemon's stop, or the end of the worker's task, releases
them without starting them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runner.engine.worker import Worker


async def until(*aws: Awaitable[Any], timeout: float | None = None) -> None:
    """Wait until the first of ``aws`` is done (or ``timeout`` seconds passed); the waits
    made here are cancelled after, a task given is left running."""
    futures = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for made, given in zip(futures, aws, strict=True):
            if made is not given:
                made.cancel()


class FirstCycle:
    """The gate of one daemon: its ``worker``, its ``stop`` event (set: every part ends)
    and its ``idle`` event (set once, after the first cycle, the worker was quiet).
    ``task`` is the worker's task, set when the daemon starts it (``None`` before)."""

    def __init__(self, worker: Worker, stop: asyncio.Event, idle: asyncio.Event) -> None:
        self.worker, self.stop, self.idle = worker, stop, idle
        self.task: asyncio.Future[None] | None = None

    def over(self) -> bool:
        """True once the daemon stops or the worker's task ended (or never started)."""
        return self.stop.is_set() or self.task is None or self.task.done()

    async def passed(self) -> bool:
        """Wait until the worker's first cycle is over; False if the daemon stops first."""
        assert self.task is not None
        await until(self.worker.first_cycle.wait(), self.stop.wait(), self.task)
        return not self.over()

    async def quiet(self, within: float) -> bool:
        """Wait until the first cycle is over and then until the worker has nothing to do
        (``idle``), at most ``within`` seconds more; False if the daemon stops first."""
        if not await self.passed():
            return False
        assert self.task is not None
        await until(self.idle.wait(), self.stop.wait(), self.task, timeout=within)
        return True

    def later(self, run: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
        """``run`` once the worker's first cycle is over: the first claim does not wait for
        the connection or imports of the parts that can start later (the listener looks
        once when it has connected, so nothing sent before is missed)."""

        async def later() -> None:
            if await self.passed():
                await run()

        return later
