"""The worker's database thread: blocking database calls run there, off the event loop.

One thread, so the worker's own statements never compete with each other for a
connection or the SQLite write lock; handlers keep running on the loop meanwhile. (On
PostgreSQL a second one runs a second cycle while the first is in flight,
``cycle_runner``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.exc import DBAPIError

from runner.engine.timers import OutageBackoff, OutageLog
from runner.store.db import trust_fresh_connections


class DatabaseThread:
    """One thread for a worker's blocking database calls, named ``name`` (``flowrun-db``;
    the second cycle's thread on PostgreSQL: ``flowrun-cycles``, ``cycle_runner``).
    Database faults of its guarded and retried calls are logged through ``said`` (the
    worker's :class:`OutageLog`; a new one when not given): repeats folded."""

    def __init__(self, name: str = "flowrun-db", said: OutageLog | None = None) -> None:
        self.said = said if said is not None else OutageLog()
        # the worker's cycles follow each other closely: no ping before each (a round
        # trip); a connection lost meanwhile fails a cycle, which is retried
        self.pool = ThreadPoolExecutor(
            1, thread_name_prefix=name, initializer=trust_fresh_connections
        )

    def submit(self, fn: Callable, *args: Any) -> asyncio.Future:
        """Start ``fn(*args)`` on the thread; returns the running loop's future of it."""
        return asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def call(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on the thread; its exceptions propagate."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def guard(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on the thread; a database error (``DBAPIError``) is reported to
        ``said`` (one line, repeats folded) and ``None`` returned; the first success after
        one logs the return."""
        try:
            result = await self.call(fn, *args)
        except DBAPIError as exc:
            self.said.failed(exc)
            return None
        self.said.back()
        return result

    async def retrying(self, fn: Callable, *args: Any, give_up: Callable[[], bool]) -> Any:
        """``fn(*args)`` on the thread, retried with :class:`OutageBackoff` while the
        database is away; the error propagates once ``give_up()`` is true."""
        backoff = OutageBackoff(self.said)
        while True:
            try:
                return await self.call(fn, *args)
            except DBAPIError as exc:
                if give_up():
                    raise
                await asyncio.sleep(backoff.fail(exc))

    def shutdown(self) -> None:
        """Stop the thread once its current call returns (no waiting here)."""
        self.pool.shutdown(wait=False)
