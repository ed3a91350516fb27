"""The worker loop: claim due instances, run their handlers, commit the outcomes.

A reconciliation loop after Takahē's Stator: there is no queue, only rows that are due.
Each turn of the loop is one transaction that commits every finished attempt (fenced) and
claims as many due instances as there are free slots (``--concurrency``); handlers run
concurrently as asyncio tasks. While attempts run, their leases are renewed every third of
the lease, and every ``fence_poll`` seconds the worker checks whether an operator command
(pause, kill, send) or another worker took an instance away: that attempt is cancelled at
once (process group terminated, coroutine cancelled) and recorded ``cancelled``.

Shutdown (huey's consumer, Stator's runstator): :meth:`Worker.request_stop` once → stop
claiming and let running attempts finish within ``grace`` seconds (then cancel them),
release every lock, exit cleanly; twice → abort now: handler process groups are killed and
the attempts still running are left for a worker to record as ``lost`` once their lease
has expired (``store.recover_lost``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine import cycle
from runner.engine.attempt_run import load_event_payload, run_attempt
from runner.handlers import reaper
from runner.handlers.attempt import AttemptResult, Cancel
from runner.store import heartbeat, leases, rows
from runner.store.db import no_wait_engine, reading, short_error
from runner.store.wal import WalCheckpointer

log = logging.getLogger("flowrun.worker")


@dataclass
class WorkerConfig:
    """Options of one worker; every duration is in seconds.

    ``poll`` is the idle wait between looks for due work (a local wake-up, e.g. a sensor
    creating an instance, cuts it short); ``fence_poll`` how often running attempts are
    checked for commands; ``grace`` how long a graceful stop waits for running attempts.
    """

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    lease: float = 60.0
    concurrency: int = 8
    poll: float = 0.05
    fence_poll: float = 0.25
    grace: float = 30.0
    kill_grace: float = 5.0
    heartbeat: float = 2.0
    exit_when_idle: bool = False


@dataclass
class _Running:
    claim: rows.Claim
    task: asyncio.Task
    cancel: Cancel
    durable: list  # [data as last stored]


class Worker:
    """One worker over ``engine``; ``await worker.run()`` until stopped.

    ``idle_hint`` is an optional callable returning True while something outside the
    instance table (a sensor still settling files, unhandled events) may still create
    work; ``--exit-when-idle`` waits for it.
    """

    def __init__(
        self,
        engine: Engine,
        config: WorkerConfig | None = None,
        *,
        idle_hint: Callable[[], bool] | None = None,
    ):
        self.engine = engine
        self.config = config or WorkerConfig()
        self.idle_hint = idle_hint
        self.running: dict[int, _Running] = {}
        self.finished: list[tuple[_Running, AttemptResult]] = []
        self.stats = {"claimed": 0, "chained": 0, "committed": 0, "cancelled": 0, "lost_fence": 0}
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._abort = False
        self._poke = False
        self._db = ThreadPoolExecutor(1, thread_name_prefix="flowrun-db")
        self._threads = ThreadPoolExecutor(
            max(4, self.config.concurrency), thread_name_prefix="flowrun-call"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._no_wait = no_wait_engine(engine)
        self._wal: WalCheckpointer | None = None
        #: ``cycle.run_cycle``'s arguments after the engine: worker id, lease, counters.
        self._cycle_context = (self.config.worker_id, self.config.lease, self.stats)

    # -- control -----------------------------------------------------------------------

    def wake(self) -> None:
        """Look for due work now (thread-safe): the next loop turn claims at once."""
        self._poke = True
        if self._loop and self._wake:
            self._loop.call_soon_threadsafe(self._wake.set)

    def request_stop(self) -> str:
        """First call: graceful stop; second: abort. Returns "graceful" or "abort"."""
        if not self._stopping:
            self._stopping = True
            self.wake()
            return "graceful"
        self._abort = True
        self.wake()
        return "abort"

    @property
    def stopping(self) -> bool:
        """True once a stop was requested."""
        return self._stopping

    # -- the loop ----------------------------------------------------------------------

    async def _in_db(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, *args)

    async def run(self) -> None:
        """Run until stopped (or idle, with ``exit_when_idle``).

        At most one database cycle is in flight at a time. On PostgreSQL it runs on the
        worker's database thread while handlers keep running on the loop (its statements
        are network round trips). On SQLite it runs on the loop itself, through a sibling
        engine that never waits for the write lock (``db.no_wait_engine``): a cycle takes
        about 1.5 ms for 64 attempts, and handing it to a thread and back cost more than
        the handlers lost by waiting (measured: +15-20% attempts/s); when another
        process holds the lock, that cycle goes to the database thread, which may wait.
        A cycle that fails because the database went away is retried with backoff, with
        its finished attempts kept: nothing is lost.
        """
        cfg = self.config
        loop = self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        await self._retrying(heartbeat.register, self.engine, cfg.worker_id)
        log.info(
            "worker %s started (concurrency %d, lease %gs)",
            cfg.worker_id,
            cfg.concurrency,
            cfg.lease,
        )
        now = time.monotonic()
        next_renew, next_fence, next_beat, next_idle, next_probe = now, now, now, now, now
        next_recover = now  # look for attempts lost by dead workers (leases.recover_lost)
        recover_every = min(1.0, cfg.lease / 4)
        grace_deadline: float | None = None
        want_claim = True
        inflight: asyncio.Future | None = None
        sent: list = []
        backoff = cycle.OutageBackoff()
        if self._no_wait is not None:  # its commits leave checkpoints to this thread
            self._wal = WalCheckpointer(self._no_wait.url.database or "").start()
        reaper.start()  # exec handlers' escaped descendants are ended with their attempt
        try:
            while not self._abort:
                now = time.monotonic()
                if self._stopping:
                    if grace_deadline is None:
                        grace_deadline = now + cfg.grace
                        log.info(
                            "stopping: %d attempts running, grace %gs", len(self.running), cfg.grace
                        )
                    if not self.running and not self.finished and inflight is None:
                        break
                    if now > grace_deadline:
                        self._cancel_all("worker shutting down (grace period over)")
                if inflight is not None and inflight.done():
                    try:
                        claims, chained, recovered, lost, limit = inflight.result()
                    except DBAPIError as exc:
                        self.finished[:0] = sent  # commit them with the next cycle
                        await asyncio.sleep(backoff.fail(exc))
                        want_claim = True
                    else:
                        backoff.ok()
                        self.stats["committed"] += len(sent) - len(lost)
                        self.stats["lost_fence"] += len(lost)
                        cycle.log_lost(recovered)
                        self._start(chained + claims)
                        want_claim = limit > 0 and len(claims) == limit
                    inflight, sent = None, []
                if self._poke:
                    self._poke, want_claim = False, True
                if inflight is None:
                    free = 0 if self._stopping else cfg.concurrency - len(self.running)
                    probe = free > 0 and not want_claim and now >= next_probe
                    recover = not self._stopping and now >= next_recover
                    if self.finished or recover or (free > 0 and (want_claim or probe)):
                        sent, self.finished = self.finished, []
                        decided = cycle.decide_finished(self.engine, sent, free, self._stopping)
                        args = (*decided, free, probe, recover)
                        inflight = self._inline_cycle(loop, args)
                        if inflight is None:
                            inflight = loop.run_in_executor(
                                self._db, cycle.run_cycle, self.engine, *self._cycle_context, *args
                            )
                        inflight.add_done_callback(lambda _f: self._wake and self._wake.set())
                        want_claim = False
                        if probe:
                            next_probe = now + cfg.poll
                        if recover:
                            next_recover = now + recover_every
                        continue
                if self.running and (now >= next_fence or now >= next_renew):
                    renew = now >= next_renew
                    await self._check_leases(renew)
                    next_fence = now + cfg.fence_poll
                    if renew:
                        next_renew = now + cfg.lease / 3
                if now >= next_beat:
                    await self._guard(heartbeat.beat, self.engine, cfg.worker_id, len(self.running))
                    next_beat = now + cfg.heartbeat
                if (
                    cfg.exit_when_idle
                    and inflight is None
                    and not self.running
                    and not self.finished
                    and now >= next_idle
                ):
                    next_idle = now + 0.2
                    if await self._guard(self._idle):
                        log.info("nothing runnable, due, running or pending: exiting")
                        break
                if inflight is not None:
                    timeout = 1.0  # its done-callback wakes us
                elif not self._stopping and len(self.running) < cfg.concurrency:
                    timeout = max(0.0, min(next_probe, next_recover) - time.monotonic())
                else:
                    timeout = cfg.fence_poll
                if self.running:
                    timeout = min(timeout, cfg.fence_poll)
                await self._wait(timeout)
        finally:
            if inflight is not None:
                try:
                    await inflight
                except DBAPIError:
                    self.finished[:0] = sent
            try:
                await self._finish()
            finally:
                reaper.stop()

    async def _retrying(self, fn: Callable, *args: Any) -> Any:
        """Run ``fn`` on the database thread, retrying with backoff while it is down."""
        backoff = cycle.OutageBackoff()
        while True:
            try:
                return await self._in_db(fn, *args)
            except DBAPIError as exc:
                if self._abort:
                    raise
                await asyncio.sleep(backoff.fail(exc))

    async def _guard(self, fn: Callable, *args: Any) -> Any:
        """Run ``fn`` on the database thread; a database error is logged, not raised."""
        try:
            return await self._in_db(fn, *args)
        except DBAPIError as exc:
            log.warning("database unavailable (%s)", short_error(exc))
            return None

    async def _wait(self, timeout: float) -> None:
        assert self._wake is not None
        if not self._wake.is_set() and timeout > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(0)  # always let the handlers run
        self._wake.clear()

    def _inline_cycle(self, loop, args) -> asyncio.Future | None:
        """Run one cycle right here on the loop through the no-wait engine (SQLite);
        ``None`` when the write lock is taken (the caller uses the database thread).

        ``args`` is ``(outcomes, cancels, chain, free, probe, recover)`` as taken by
        ``cycle.run_cycle`` after its engine and worker context."""
        if self._no_wait is None:
            return None
        return cycle.run_inline(loop, self._no_wait, self._cycle_context, args)

    def _idle(self) -> bool:
        hint = self.idle_hint
        return (hint is None or not hint()) and cycle.nothing_pending(self.engine)

    # -- attempts ----------------------------------------------------------------------

    def _start(self, claims: list[rows.Claim]) -> None:
        loop = asyncio.get_running_loop()
        for claim in claims:
            run = _Running(claim, None, Cancel(), [claim.data])  # type: ignore[arg-type]
            run.task = loop.create_task(self._attempt(run))
            self.running[claim.id] = run

    async def _attempt(self, run: _Running) -> None:
        """Run one attempt and hand its result to the loop (``finished``).

        The attempt's own task reports its end itself, rather than through a done
        callback: one less callback scheduled per attempt. A worker abort (the task
        cancelled) is reported as ``cancelled``; a bug below as an ``error``.
        """
        try:
            result = await run_attempt(
                self.engine,
                run.claim,
                run.cancel,
                run.durable,
                worker_id=self.config.worker_id,
                kill_grace=self.config.kill_grace,
                threads=self._threads,
                load_event=lambda: self._in_db(load_event_payload, self.engine, run.claim.event_id),
            )
        except asyncio.CancelledError:
            self._finished(run, AttemptResult("cancelled", run.durable[0], error="worker aborted"))
            raise
        except Exception as exc:  # noqa: BLE001 - recorded on the attempt, never lost
            error = f"flowrun: {type(exc).__name__}: {exc}"
            result = AttemptResult("error", run.durable[0], error=error)
        self._finished(run, result)

    def _finished(self, run: _Running, result: AttemptResult) -> None:
        self.running.pop(run.claim.id, None)
        self.finished.append((run, result))
        if self._wake is not None:
            self._wake.set()

    async def _check_leases(self, renew: bool) -> None:
        held = {iid: r.claim.fence for iid, r in self.running.items()}

        def check():
            if renew:
                with self.engine.begin() as conn:
                    return leases.renew(conn, self.config.worker_id, held, self.config.lease)
            with reading(self.engine) as conn:
                return leases.taken_away(conn, self.config.worker_id, held)

        for iid in await self._guard(check) or ():
            run = self.running.get(iid)
            if run is not None and not run.cancel.is_set():
                log.info(
                    "instance %d: taken away (command or lease lost); cancelling its attempt", iid
                )
                run.cancel.set("cancelled: the instance was paused, killed, moved or taken over")

    def _cancel_all(self, reason: str) -> None:
        for run in self.running.values():
            run.cancel.set(reason)

    # -- bookkeeping -------------------------------------------------------------------

    async def _finish(self) -> None:
        if self._abort:
            self._kill_groups()
            log.warning(
                "aborted: %d attempts left for the next claim to recover", len(self.running)
            )
            for run in self.running.values():
                run.task.cancel()
        else:
            for _ in range(5):  # the last outcomes; the database may be briefly away
                batch, self.finished = self.finished, []
                if not batch:
                    break
                outcomes, cancels, _ = cycle.decide_finished(self.engine, batch, 0, self._stopping)
                args = (outcomes, cancels, [], 0, False, False)
                try:
                    await self._in_db(cycle.run_cycle, self.engine, *self._cycle_context, *args)
                except DBAPIError as exc:
                    self.finished[:0] = batch
                    log.warning("database unavailable at stop (%s); retrying", short_error(exc))
                    await asyncio.sleep(1.0)

        try:
            await self._guard(
                heartbeat.stopped,
                self.engine,
                self.config.worker_id,
                len(self.running),
                not self._abort,
            )
        finally:
            if self._wal is not None:
                self._wal.stop()
            if self._no_wait is not None:
                self._no_wait.dispose()
            self._db.shutdown(wait=False)
            self._threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker %s stopped", self.config.worker_id)

    def _kill_groups(self) -> None:
        """Abort: SIGKILL every handler process group still running, and what they left."""
        reaper.kill_all(signal.SIGKILL)
