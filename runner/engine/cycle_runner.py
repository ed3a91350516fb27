"""Where and when the worker's database cycles run: one in flight, or two on PostgreSQL.

A :class:`CycleRunner` takes the finished attempts of a ``running.RunningAttempts`` into
a ``cycle.CycleRequest``, runs the cycle (``cycle.run_cycle``) and hands back its
``cycle.CycleResult``; a cycle that failed (``DBAPIError``) gives its attempts back, to be
committed by the next one: nothing is lost. The worker loop (``runner.engine.worker``)
decides when to run one; this module only runs it.

On PostgreSQL a cycle runs on the worker's database thread while handlers keep running on
the loop (its statements are network round trips). On SQLite it runs on the loop itself,
through a sibling engine that never waits for the write lock (``db.no_wait_engine``): a
cycle takes about 1.5 ms for 64 attempts, and handing it to a thread and back cost more
than the handlers lost by waiting (measured: +15-20% attempts/s). When another
connection holds the lock (another process, or this one's attempt-log writer in one of
its short statements), the cycle tries again on the loop every millisecond, up to
:data:`INLINE_TRIES` times, and only then goes to the database thread, which waits in
SQLite's busy handler. A cycle on the thread, its statements each waiting for the GIL
held by a loop busy with handlers, took 5-10 ms where one on the loop takes about 1 (it
was the whole tail of new work's start latency with 20 handlers writing at full speed).

On PostgreSQL a second cycle may be in flight while the first is on the server
(``overlap``): it runs on a second database thread, over a second pooled connection, so
that the server works on one batch while the loop runs the attempts another claimed. A
cycle's work is about half the server's and half the client's (``docs/performance.md``,
"Two cycles in flight"); one at a time, one core would idle. Each finished attempt and each
claim to give back is in exactly one cycle; the claims of two cycles are distinct rows
(``FOR UPDATE SKIP LOCKED``, and a claimed row is not due); the worker asks the second
cycle for no more than the room the first leaves (:meth:`CycleRunner.claiming`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine import cycle, seats
from runner.engine.cycle import CycleRequest, CycleResult
from runner.engine.db_thread import DatabaseThread
from runner.engine.running import Running, RunningAttempts
from runner.handlers.attempt import AttemptResult
from runner.store.db import no_wait_engine
from runner.store.wal import WalCheckpointer

#: The fewest finished attempts a second cycle starts for while one is in flight: a
#: smaller batch costs the server too little to be worth overlapping, and a cycle more
#: costs its fixed share on both sides (I/O-bound attempts end a few at a time).
OVERLAP_MIN = 32
#: Times a SQLite cycle is tried on the loop, a millisecond apart, while another
#: connection holds the write lock, before it goes to the database thread.
INLINE_TRIES = 5
#: Seconds between those tries.
INLINE_AGAIN = 0.001


@dataclass(slots=True)
class Flight:
    """One cycle in flight: the ``future`` of its :class:`CycleResult`, its ``request``,
    the finished attempts it commits (``sent``) and the waiting claims it gives back
    (``released``), both handed back if it fails, the ``thread`` it runs on and when it
    ``started`` (``time.monotonic()``)."""

    future: asyncio.Future[CycleResult]
    request: CycleRequest
    sent: list[tuple[Running, AttemptResult]] = field(default_factory=list)
    released: list[Running] = field(default_factory=list)
    thread: DatabaseThread | None = None
    started: float = 0.0


class CycleRunner:
    """The database cycles of one worker over ``engine``, committing the attempts that
    ``attempts`` finished; blocking cycles go to ``db`` (and, with ``overlap``, on
    PostgreSQL with a pool that keeps two connections, ``store.pg_engine.pg_engine``, a second
    cycle to a second database thread, whose calls get ``timeout`` seconds like
    ``db``'s, ``db_thread.DatabaseThread``).

    ``flights`` are the cycles in flight (:class:`Flight`, in the order they started; at
    most :attr:`most`; :attr:`overlapped` counts those started while another was in
    flight); ``on_done()`` is called on the loop when one ends. ``no_wait``
    is the SQLite engine that never waits for the write lock (``None`` on PostgreSQL),
    ``wal`` its checkpointer once :meth:`start_wal` ran.
    """

    def __init__(
        self,
        engine: Engine,
        attempts: RunningAttempts,
        db: DatabaseThread,
        *,
        overlap: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.engine = engine
        self.attempts = attempts
        self.db = db
        self.no_wait = no_wait_engine(engine)
        self.wal: WalCheckpointer | None = None
        self.flights: list[Flight] = []
        self.overlapped = 0
        self.on_done: Callable[[], None] | None = None
        #: SQLite: the next try on the loop of a cycle that met the write lock, by future
        self._tries: dict[asyncio.Future[CycleResult], asyncio.TimerHandle] = {}
        self._threads = [db]
        # a pool of two connections or more (PostgreSQL's ``QueuePool``; an in-memory
        # SQLite engine's pool has no ``size()``, and one connection)
        size = getattr(engine.pool, "size", None)
        if overlap and self.no_wait is None and callable(size) and size() >= 2:
            self._threads.append(DatabaseThread("flowrun-cycles", db.said, timeout=timeout))
        self._sent: list[tuple[Running, AttemptResult]] = []  # the request's finished attempts
        self._released: list[Running] = []  # the waiting claims it gives back

    @property
    def most(self) -> int:
        """How many cycles may be in flight at once (1, or 2 with ``overlap``)."""
        return len(self._threads)

    def start_wal(self) -> None:
        """Start the WAL checkpointer of the no-wait engine (its commits leave
        checkpoints to that thread); nothing on PostgreSQL."""
        if self.no_wait is not None:
            self.wal = WalCheckpointer(self.no_wait.url.database or "").start()

    def request(
        self, request: CycleRequest, *, stopping: bool, release: list[Running] | None = None
    ) -> CycleRequest:
        """Fill ``request`` with every attempt finished so far (``cycle.decide_finished``;
        they are held until the cycle that commits them is done) and the waiting claims
        to give back (``release``: ``running.Running`` objects taken out of ``waiting``),
        and return it (for :meth:`submit` or :meth:`run_now`)."""
        self._sent = self.attempts.take()
        self._released = release or []
        request.release = [r.claim for r in self._released]
        return cycle.decide_finished(self.engine, self._sent, request, stopping=stopping)

    def submit(self, request: CycleRequest) -> asyncio.Future[CycleResult]:
        """Start one cycle (a new :class:`Flight`; at most :attr:`most` at once): right
        here on the loop through the no-wait engine (SQLite), or, on PostgreSQL or while
        another process holds the SQLite write lock, on a database thread no other
        cycle in flight uses."""
        loop = asyncio.get_running_loop()
        fut, thread = None, None
        if self.no_wait is not None:
            fut = cycle.run_inline(loop, self.no_wait, request)
            if fut is None:  # the write lock is taken: again on the loop in a moment
                fut, thread = loop.create_future(), self.db
                self._try_again(fut, request, INLINE_TRIES - 1)
        if fut is None:
            busy = [f.thread for f in self.flights]
            thread = next(t for t in self._threads if t not in busy)
            fut = thread.submit(cycle.run_cycle, self.engine, request)
        fut.add_done_callback(self._ended)
        self.overlapped += bool(self.flights)
        flight = Flight(fut, request, self._sent, self._released, thread, time.monotonic())
        self.flights.append(flight)
        self._sent, self._released = [], []
        return fut

    def _try_again(
        self, fut: asyncio.Future[CycleResult], request: CycleRequest, tries: int
    ) -> None:
        """Try the cycle of ``fut`` on the loop again in :data:`INLINE_AGAIN` s."""
        loop = fut.get_loop()
        self._tries[fut] = loop.call_later(INLINE_AGAIN, self._again, fut, request, tries)

    def _again(self, fut: asyncio.Future[CycleResult], request: CycleRequest, tries: int) -> None:
        """Try the cycle of ``fut`` on the loop again (SQLite); after ``tries`` more, on
        the database thread (where SQLite's busy handler waits for the lock)."""
        self._tries.pop(fut, None)
        if fut.done() or self.no_wait is None:
            return
        done = cycle.run_inline(fut.get_loop(), self.no_wait, request)
        if done is not None:
            _copy(done, fut)
        elif tries > 0:
            self._try_again(fut, request, tries - 1)
        else:
            later = self.db.submit(cycle.run_cycle, self.engine, request)
            later.add_done_callback(lambda f: _copy(f, fut))

    def _ended(self, _fut: asyncio.Future[CycleResult]) -> None:
        if self.on_done is not None:
            self.on_done()

    def can_submit(self) -> bool:
        """True while fewer than :attr:`most` cycles are in flight."""
        return len(self.flights) < len(self._threads)

    def stuck(self, now: float, limit: float) -> bool:
        """True when a cycle in flight has waited more than ``limit`` seconds at ``now``
        (``time.monotonic()``): the database does not answer."""
        return any(now - f.started > limit for f in self.flights)

    def claiming(self) -> int:
        """How many instances the cycles in flight may still claim or chain (the sum of
        their requests' ``free``): room the worker must not ask for again."""
        return sum(f.request.free for f in self.flights)

    def done(self) -> bool:
        """True when a cycle in flight has ended (:meth:`collect` it)."""
        return any(f.future.done() for f in self.flights)

    def collect(self) -> CycleResult:
        """The result of the first cycle in flight that has ended (it leaves
        :attr:`flights`). Raises its ``DBAPIError`` once its attempts are back, for the
        next cycle."""
        flight = next(f for f in self.flights if f.future.done())
        self.flights.remove(flight)
        try:
            result = flight.future.result()
        except DBAPIError:
            self._give_back(flight.sent, flight.released)
            raise
        self._committed(flight.sent, result)
        return result

    async def settle(self, timeout: float | None = None) -> list[CycleResult]:
        """Wait for the cycles in flight, if any; the results of those that succeeded
        (a failed one's attempts are back for the next cycle). After ``timeout`` seconds
        (an abort: the network may be dead) the cycles still in flight are left behind."""
        results = []
        end = None if timeout is None else time.monotonic() + timeout
        while self.flights:
            left = None if end is None else max(0.0, end - time.monotonic())
            done, _ = await asyncio.wait([f.future for f in self.flights], timeout=left)
            if not done:  # left behind: their errors, when they come, are expected
                for flight in self.flights:
                    flight.future.add_done_callback(_forget)
                self.flights.clear()
                break
            while self.done():
                try:
                    results.append(self.collect())
                except DBAPIError:
                    pass
        return results

    async def run_now(self, request: CycleRequest) -> CycleResult:
        """Run one cycle on the database thread and wait for it (no cycle may be in
        flight). Raises ``DBAPIError`` once the request's attempts are back."""
        sent, released = self._sent, self._released
        self._sent, self._released = [], []
        try:
            result = await self.db.call(cycle.run_cycle, self.engine, request)
        except DBAPIError:
            self._give_back(sent, released)
            raise
        self._committed(sent, result)
        return result

    def _committed(self, sent: list[tuple[Running, AttemptResult]], result: CycleResult) -> None:
        """The cycle that committed ``sent`` succeeded: the seats it handed on are the
        standbys' (``seats.settled``); a standby left in a void seat is cancelled."""
        seats.settled(sent, result.unseated)
        if result.unseated:
            self.attempts.taken_away([c.id for c in result.unseated])

    def _give_back(
        self, sent: list[tuple[Running, AttemptResult]], released: list[Running]
    ) -> None:
        """The attempts of a failed cycle go back, ahead of those finished since, and the
        claims it was to give back wait again."""
        self.attempts.put_back(sent)
        self.attempts.keep_waiting(released)

    def hurry(self, at: float) -> None:
        """From ``at`` (``time.monotonic()`` s) on, a call on any of the cycles' database
        threads that waits on the network is broken off quickly (a stop:
        ``db_thread.DatabaseThread.hurry``)."""
        for thread in self._threads:
            thread.hurry(at)

    def close(self) -> None:
        """Stop the checkpointer, the second database thread and dispose of the no-wait
        engine; a cycle waiting for its next try on the loop is cancelled (it claimed
        nothing)."""
        for fut, handle in self._tries.items():
            handle.cancel()
            fut.cancel()
        self._tries.clear()
        if self.wal is not None:
            self.wal.stop()
        for thread in self._threads[1:]:
            thread.shutdown()
        if self.no_wait is not None:
            self.no_wait.dispose()


def _copy(src: asyncio.Future[CycleResult], dst: asyncio.Future[CycleResult]) -> None:
    """``dst`` ends as ``src`` did (unless it ended already)."""
    if dst.done():
        return
    if src.cancelled():
        dst.cancel()
    elif (exc := src.exception()) is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())


def _forget(fut: asyncio.Future[CycleResult]) -> None:
    """Retrieve a left-behind cycle's outcome, so its error is not reported as unseen."""
    if not fut.cancelled():
        fut.exception()
