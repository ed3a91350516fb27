"""Results from worker threads to asyncio futures, one loop wake-up per batch.

``loop.run_in_executor`` costs a wake-up of the loop (a write to its self-pipe, a read,
a callback) for every result. Spawn threads finish an ``exec`` handler's start every few
hundred microseconds, so that would be a large part of the loop's time per attempt
(``docs/performance.md``, "Spawn threads and hand-offs"). A :class:`Handoff` queues
results and wakes each loop once for all the results queued until it runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


class Handoff:
    """A queue of ``(future, result, exception)`` per event loop, delivered in batches.

    ``discard(result)``, if given, is called on the loop for a result whose future was
    cancelled meanwhile (e.g. to close what it holds).
    """

    def __init__(self, discard: Callable[[Any], None] | None = None) -> None:
        self.discard = discard
        self._lock = threading.Lock()
        self._queues: dict[asyncio.AbstractEventLoop, list[Any]] = {}

    def put(
        self,
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[Any],
        result: Any,
        exc: BaseException | None,
    ) -> None:
        """Resolve ``fut`` (a future of ``loop``) with ``exc`` if given, else ``result``,
        soon; thread-safe. Nothing happens if ``loop`` is closed."""
        with self._lock:
            queue = self._queues.setdefault(loop, [])
            queue.append((fut, result, exc))
            first = len(queue) == 1
        if first:
            try:
                loop.call_soon_threadsafe(self._deliver, loop)
            except RuntimeError:  # the loop is closed (a worker that aborted)
                with self._lock:
                    self._queues.pop(loop, None)

    def _deliver(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            batch = self._queues.pop(loop, [])
        for fut, result, exc in batch:
            if fut.done():
                if exc is None and self.discard is not None:
                    self.discard(result)
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
