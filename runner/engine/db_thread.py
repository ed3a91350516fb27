"""The worker's database thread: blocking database calls run there, off the event loop.

One thread, so the worker's own statements never compete with each other for a
connection or the SQLite write lock; handlers keep running on the loop meanwhile. (On
PostgreSQL a second one runs a second cycle while the first is in flight,
``cycle_runner``.)

On PostgreSQL a call has a time limit (``timeout``): a statement still waiting for the
server after it has its connection broken off (``store.checked_out.interrupt``), so a dead or
frozen network is one failed call (a database outage: retried, nothing lost) instead of
a thread stuck in a socket read. The limit counts how long the connection has waited
for the server, not the call's length (``store.checked_out.server_wait``): a call of many round
trips, or one whose answer has come but waits to be read by a process starved of CPU (32
daemons starting on 2 cores), is left to finish (up to :data:`STARVED` times the limit).
Once the worker stops, calls get much less (:meth:`DatabaseThread.hurry`). The thread is
a daemon thread: a call that cannot be broken off (a connection attempt, bounded by
``connect_timeout``) never keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError

from runner.engine.timers import OutageBackoff, OutageLog
from runner.store.checked_out import interrupt, server_wait
from runner.store.db import STATEMENT_TIMEOUT
from runner.store.pg_engine import trust_fresh_connections

log = logging.getLogger("flowrun.worker")  # the worker's own log: these are its messages

#: Seconds a worker's database call may wait on PostgreSQL before its connection is
#: broken off (a cycle takes milliseconds; a black-holed network never answers): a
#: little more than the server's own ``statement_timeout``, which cancels a slow statement
#: cleanly first.
CALL_TIMEOUT = STATEMENT_TIMEOUT + 0.5
#: Seconds a call may take once the worker is stopping and its grace is over, or after
#: a second stop request (:meth:`DatabaseThread.hurry`).
HURRY_TIMEOUT = 1.0
#: A call longer than this many times its limit is broken off even while its server has
#: answered (``store.checked_out.server_wait`` says 0): a network frozen in the middle of a long
#: answer looks the same as a thread starved of CPU, and starvation does not last that long.
STARVED = 3


def _resolve(fut: asyncio.Future[None]) -> None:
    """Set ``fut``'s result (``None``) unless it is done already."""
    if not fut.done():
        fut.set_result(None)


class DaemonThreads(ThreadPoolExecutor):
    """An executor of up to ``size`` daemon threads named ``name``, started as needed,
    running each call once (with ``size`` 1: in order).

    A ``ThreadPoolExecutor`` by type only (``asyncio`` takes no other as a loop's default
    executor): every method it uses is its own, and it registers no thread for the
    interpreter to join.

    Unlike ``ThreadPoolExecutor``, whose threads the interpreter joins at exit (and
    ``asyncio.run`` as the default executor), a call stuck here (in a socket read the
    network never answers) does not keep the process alive. With ``size`` 1,
    ``busy_since`` is the ``time.monotonic()`` at which the current call began (``None``:
    idle) and ``ident`` the thread's ``threading.get_ident()``; ``initializer()`` runs
    first on each thread.
    """

    def __init__(
        self, name: str, size: int = 1, initializer: Callable[[], None] | None = None
    ) -> None:  # no super().__init__(): nothing of ThreadPoolExecutor's own is used
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._name, self._size, self._initializer = name, size, initializer
        self._started: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self.busy_since: float | None = None
        self.ident: int | None = None
        if size == 1:
            self._grow()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)``; returns its ``concurrent.futures.Future``."""
        fut: Future[Any] = Future()
        self._queue.put((fut, fn, args, kwargs))
        if self._idle == 0 and len(self._started) < self._size:
            self._grow()
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads after the calls queued so far (never waits for them)."""
        for _ in self._started:
            self._queue.put(None)

    def _grow(self) -> None:
        with self._lock:
            if len(self._started) >= self._size:
                return
            started = threading.Event()
            thread = threading.Thread(
                target=self._work,
                args=(started,),
                name=f"{self._name}_{len(self._started)}",
                daemon=True,
            )
            self._started.append(thread)
            thread.start()
        started.wait()

    def _work(self, started: threading.Event) -> None:
        self.ident = threading.get_ident()
        if self._initializer is not None:
            self._initializer()
        started.set()
        while True:
            with self._lock:
                self._idle += 1
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            self.busy_since = time.monotonic()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.busy_since = None
                fut.set_exception(exc)
            else:
                self.busy_since = None
                fut.set_result(result)


class DatabaseThread:
    """One thread for a worker's blocking database calls, named ``name`` (``flowrun-db``;
    the second cycle's thread on PostgreSQL: ``flowrun-cycles``, ``cycle_runner``).
    Database faults of its guarded and retried calls are logged through ``said`` (the
    worker's :class:`OutageLog`; a new one when not given): repeats folded.

    ``timeout``: seconds a call may run before its PostgreSQL connection is broken off
    (``None``: no limit, as on SQLite, whose calls never wait on a network); checked by
    one loop timer while calls are pending, not per call.
    """

    def __init__(
        self,
        name: str = "flowrun-db",
        said: OutageLog | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        self.said = said if said is not None else OutageLog()
        # the worker's cycles follow each other closely: no ping before each (a round
        # trip); a connection lost meanwhile fails a cycle, which is retried
        self.pool = DaemonThreads(name, 1, trust_fresh_connections)
        self.timeout = timeout
        #: ``time.monotonic()`` after which calls get :data:`HURRY_TIMEOUT` (``hurry``)
        self.hurry_at = math.inf
        self._pending = 0
        self._timer: asyncio.TimerHandle | None = None
        #: set when the calls made before :meth:`hurry` and still waiting are given up
        self._gone: asyncio.Future[None] | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Start ``fn(*args)`` on the thread; returns the running loop's future of it."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.pool, fn, *args)
        if self.timeout is not None:
            self._pending += 1
            fut.add_done_callback(self._settled)
            if self._timer is None:
                self._timer = loop.call_later(self._limit(), self._check)
        return fut

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread; its exceptions propagate. Once the worker hurries
        (:meth:`hurry`), a call still waiting :data:`HURRY_TIMEOUT` seconds later raises
        ``OperationalError`` (a ``DBAPIError``: an outage), its thread left behind (stuck
        in a connection attempt, say; it is a daemon thread)."""
        fut = self.submit(fn, *args)
        if self.timeout is None:  # SQLite: nothing waits on a network
            return await fut
        if time.monotonic() >= self.hurry_at:
            await asyncio.wait((fut,), timeout=HURRY_TIMEOUT)
        else:
            gone = self._gone
            if gone is None:
                gone = self._gone = asyncio.get_running_loop().create_future()
            await asyncio.wait((fut, gone), return_when=asyncio.FIRST_COMPLETED)
        if fut.done():
            return fut.result()
        fut.cancel()
        raise OperationalError(
            None, None, ConnectionAbortedError(f"no answer within {HURRY_TIMEOUT:g}s at stop")
        )

    def hurry(self, at: float) -> None:
        """From ``at`` (``time.monotonic()`` seconds) on, a call may take only
        :data:`HURRY_TIMEOUT` seconds (the worker stops: a dead network must not hold it):
        one running longer is broken off (``store.checked_out.interrupt``), and one that cannot be
        (a connection attempt) is given up (:meth:`call`). Call on the worker's loop (or
        before it runs)."""
        self.hurry_at = min(self.hurry_at, at)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop yet: no call waits; later calls see ``hurry_at``
            return
        if self.timeout is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        wait = max(0.0, self.hurry_at - time.monotonic())
        self._timer = loop.call_later(wait, self._check)
        if self._gone is None:
            self._gone = loop.create_future()
        gone = self._gone
        loop.call_later(wait + HURRY_TIMEOUT, _resolve, gone)

    @property
    def down(self) -> bool:
        """True while the worker's database is failing (its :class:`OutageLog` counts
        failures since the database last answered)."""
        return self.said.failures > 0

    def _limit(self) -> float:
        """How long the current call may run (seconds)."""
        assert self.timeout is not None
        return HURRY_TIMEOUT if time.monotonic() >= self.hurry_at else self.timeout

    def _settled(self, _fut: asyncio.Future[Any]) -> None:
        self._pending -= 1

    def _check(self) -> None:
        """The loop timer: break off the connection of a call that has run past its
        limit; look again while calls are pending."""
        self._timer = None
        if not self._pending:
            return
        limit, since, now = self._limit(), self.pool.busy_since, time.monotonic()
        wait = limit
        if since is not None:
            waited = now - since
            if now < self.hurry_at and waited < STARVED * limit:
                # not the call's length but the time its connection has waited for the
                # server (a call of many round trips, an answer come but not yet read)
                server = server_wait(self.pool.ident)
                waited = waited if server is None else server
            if waited >= limit:
                if interrupt(self.pool.ident):
                    log.warning("database call waited more than %gs: connection broken off", limit)
            else:
                wait = min(limit - waited, since + STARVED * limit - now)
        self._timer = asyncio.get_running_loop().call_later(max(0.05, wait), self._check)

    async def guard(self, fn: Callable[..., Any], *args: Any) -> Any:
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

    async def retrying(
        self, fn: Callable[..., Any], *args: Any, give_up: Callable[[], bool]
    ) -> Any:
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
        """Stop the thread once its current call returns (no waiting here) and the
        timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.pool.shutdown(wait=False)
