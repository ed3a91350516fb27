"""Where and when the worker's database cycles run: at most one in flight at a time.

A :class:`CycleRunner` takes the finished attempts of a ``running.RunningAttempts`` into
a ``cycle.CycleRequest``, runs the cycle (``cycle.run_cycle``) and hands back its
``cycle.CycleResult``; a cycle that failed (``DBAPIError``) gives its attempts back, to be
committed by the next one: nothing is lost. The worker loop (``runner.engine.worker``)
decides when to run one; this module only runs it.

On PostgreSQL a cycle runs on the worker's database thread while handlers keep running on
the loop (its statements are network round trips). On SQLite it runs on the loop itself,
through a sibling engine that never waits for the write lock (``db.no_wait_engine``): a
cycle takes about 1.5 ms for 64 attempts, and handing it to a thread and back cost more
than the handlers lost by waiting (measured: +15-20% attempts/s); when another process
holds the lock, that cycle goes to the database thread, which may wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine import cycle
from runner.engine.cycle import CycleRequest, CycleResult
from runner.engine.db_thread import DatabaseThread
from runner.engine.running import RunningAttempts
from runner.store.db import no_wait_engine
from runner.store.wal import WalCheckpointer


class CycleRunner:
    """The database cycles of one worker over ``engine``, committing the attempts that
    ``attempts`` finished; blocking cycles go to ``db``.

    ``inflight`` is the cycle in flight (an ``asyncio.Future`` of its
    :class:`CycleResult`), ``None`` when there is none; ``on_done()`` is called on the
    loop when it ends. ``no_wait`` is the SQLite engine that never waits for the write
    lock (``None`` on PostgreSQL), ``wal`` its checkpointer once :meth:`start_wal` ran.
    """

    def __init__(self, engine: Engine, attempts: RunningAttempts, db: DatabaseThread) -> None:
        self.engine = engine
        self.attempts = attempts
        self.db = db
        self.no_wait = no_wait_engine(engine)
        self.wal: WalCheckpointer | None = None
        self.inflight: asyncio.Future | None = None
        self.on_done: Callable[[], None] | None = None
        self._sent: list = []  # the finished attempts the cycle in flight commits
        self._released: list = []  # the waiting claims it gives back

    def start_wal(self) -> None:
        """Start the WAL checkpointer of the no-wait engine (its commits leave
        checkpoints to that thread); nothing on PostgreSQL."""
        if self.no_wait is not None:
            self.wal = WalCheckpointer(self.no_wait.url.database or "").start()

    def request(
        self, request: CycleRequest, *, stopping: bool, release: list | None = None
    ) -> CycleRequest:
        """Fill ``request`` with every attempt finished so far (``cycle.decide_finished``;
        they are held until the cycle that commits them is done) and the waiting claims
        to give back (``release``: ``running.Running`` objects taken out of ``waiting``),
        and return it."""
        self._sent = self.attempts.take()
        self._released = release or []
        request.release = [r.claim for r in self._released]
        return cycle.decide_finished(self.engine, self._sent, request, stopping=stopping)

    def submit(self, request: CycleRequest) -> asyncio.Future:
        """Start one cycle (it becomes :attr:`inflight`): right here on the loop through
        the no-wait engine (SQLite), or, on PostgreSQL or while another process holds
        the SQLite write lock, on the database thread."""
        loop = asyncio.get_running_loop()
        fut = None
        if self.no_wait is not None:
            fut = cycle.run_inline(loop, self.no_wait, request)
        if fut is None:
            fut = self.db.submit(cycle.run_cycle, self.engine, request)
        fut.add_done_callback(self._ended)
        self.inflight = fut
        return fut

    def _ended(self, _fut: asyncio.Future) -> None:
        if self.on_done is not None:
            self.on_done()

    def done(self) -> bool:
        """True when a cycle was in flight and has ended (:meth:`collect` it)."""
        return self.inflight is not None and self.inflight.done()

    def collect(self) -> CycleResult:
        """The result of the cycle that ended (no cycle is in flight afterwards). Raises
        its ``DBAPIError`` once its attempts are back, for the next cycle."""
        fut, self.inflight = self.inflight, None
        assert fut is not None
        try:
            return fut.result()
        except DBAPIError:
            self.give_back()
            raise
        finally:
            self._sent, self._released = [], []

    async def settle(self) -> CycleResult | None:
        """Wait for the cycle in flight, if any; its result, or ``None`` (none, or it
        failed: its attempts are back for the next cycle)."""
        if self.inflight is None:
            return None
        await asyncio.wait([self.inflight])
        try:
            return self.collect()
        except DBAPIError:
            return None

    async def run_now(self, request: CycleRequest) -> CycleResult:
        """Run one cycle on the database thread and wait for it (no cycle may be in
        flight). Raises ``DBAPIError`` once the request's attempts are back."""
        try:
            return await self.db.call(cycle.run_cycle, self.engine, request)
        except DBAPIError:
            self.give_back()
            raise
        finally:
            self._sent, self._released = [], []

    def give_back(self) -> None:
        """The attempts of a failed cycle go back, ahead of those finished since, and the
        claims it was to give back wait again."""
        self.attempts.put_back(self._sent)
        self.attempts.keep_waiting(self._released)
        self._sent, self._released = [], []

    def close(self) -> None:
        """Stop the checkpointer and dispose of the no-wait engine."""
        if self.wal is not None:
            self.wal.stop()
        if self.no_wait is not None:
            self.no_wait.dispose()
