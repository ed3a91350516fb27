"""The attempts one worker is running: started from claims as asyncio tasks, handed back
to the loop as they end, cancelled on command.

The worker loop (``runner.engine.worker``) decides when to claim, commit and cancel;
this module keeps the attempts in between (``running`` by instance id, ``waiting`` the
claims beyond the free slots (claimed ahead, ``engine.ahead``), ``finished`` in the
order they ended) and runs each through ``attempt_run.run_attempt``. A slot that frees
starts the oldest waiting claim at once, without waiting for the loop or the database.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from runner.engine.attempt_run import load_event_payload, run_attempt
from runner.engine.fence import SelfFence
from runner.engine.seats import may_hand_on, split, take_standby
from runner.handlers import reaper
from runner.handlers.attempt import AttemptResult, Cancel
from runner.store import leases, rows
from runner.store.clock import clock_of
from runner.store.db import reading

log = logging.getLogger("flowrun.worker")  # the worker's own log: these are its messages


@dataclass
class Running:
    """One attempt in progress: its claim, its task, its cancel flag, and ``durable`` (a
    one-item list: the instance's data as last stored, replaced by each checkpoint);
    ``until`` its self-fencing deadline (``time.monotonic()`` seconds, ``fence``);
    ``fenced`` once that deadline ended it."""

    claim: rows.Claim
    task: asyncio.Task[None]
    cancel: Cancel
    durable: list[dict[str, Any]]
    until: float = math.inf
    fenced: bool = False


class RunningAttempts:
    """The attempts of worker ``worker_id`` on ``engine``, each an asyncio task.

    ``running`` maps instance ids to :class:`Running` (at most ``concurrency``);
    ``waiting`` the claims beyond them, oldest first (a :class:`Running` without a task
    yet), each started as a slot frees while :attr:`refill` is true (and given back, not
    started, once :attr:`start_within` has passed); ``finished`` holds
    ``(run, AttemptResult)`` pairs in the order the attempts ended, until the loop takes
    them (:meth:`take`); ``ends`` counts the attempts ended since the start. ``ended``
    (the loop's wake-up event, once it has one) is set whenever an attempt ends (unless
    :attr:`quiet_above` says to wait). ``in_db(fn, *args)`` runs ``fn`` on the worker's
    database thread; sync ``call`` handlers run on a pool of ``max(4, concurrency)``
    threads; ``kill_grace`` is the seconds between SIGTERM and SIGKILL of an ``exec``
    handler; ``lease`` the seconds a claim or renewal holds an instance: an attempt whose
    lease was not renewed in time is ended before it runs out (:attr:`fence`, a
    ``fence.SelfFence``). Times written to the database are on its clock
    (``store.clock``).
    """

    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        *,
        concurrency: int,
        kill_grace: float,
        in_db: Callable[..., Awaitable[Any]],
        lease: float = 60.0,
    ) -> None:
        self.engine = engine
        self.clock = clock_of(engine)
        self.fence = SelfFence(lease, kill_grace, held=self._held_runs, lapse=self._lapse)
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.kill_grace = kill_grace
        self.in_db = in_db
        self.running: dict[int, Running] = {}
        self.waiting: dict[int, Running] = {}
        #: standbys (``engine.seats``): claims with no pool seat, oldest first, each
        #: started only in the seat of one of these attempts as it ends
        self.standby: dict[int, Running] = {}
        #: the claims held that do not run yet (never replaced, like the dicts)
        self._claimed = (self.waiting, self.standby)
        #: start waiting claims as slots free (false once the worker stops)
        self.refill = True
        #: seconds after its claim a waiting claim may still start (then it is given back)
        self.start_within = 1.0
        #: waiting claims that were not started in time, to be given back
        self.lapsed: list[Running] = []
        self.finished: list[tuple[Running, AttemptResult]] = []
        self.ends = 0
        self.ended: asyncio.Event | None = None
        #: while not ``None``, an attempt's end sets ``ended`` only once at most this many
        #: attempts still run (the loop is waiting for a batch: ``batching.Hold``)
        self.quiet_above: int | None = None
        #: Called with ``(claim, result)`` for every finished attempt (metrics, attempt log).
        self.on_finished: Callable[[rows.Claim, AttemptResult], None] | None = None
        self._threads = ThreadPoolExecutor(max(4, concurrency), thread_name_prefix="flowrun-call")

    def start(self, claims: list[rows.Claim], since: float | None = None) -> None:
        """Start one attempt per claim (``rows.Claim``) as a task on the running loop,
        as many as there are free slots; the rest wait (:attr:`waiting`). ``since``
        (``time.monotonic()`` seconds; default now) precedes the statement that claimed
        them: their leases end ``lease`` seconds after it (the self-fencing deadline)."""
        if claims:
            waiting = self.waiting
            since = time.monotonic() if since is None else since
            until = self.fence.deadline(since)
            for claim in claims:
                run = Running(claim, None, Cancel(), [claim.data], until)  # type: ignore[arg-type]
                (waiting if claim.standby_pool is None else self.standby)[claim.id] = run
            self.fence.set((), since)
        if self.refill:
            self._refill()

    def _refill(self) -> None:
        """Start the oldest waiting claims while there are free slots. The attempt's
        ``started_at`` is now (epoch seconds): when its handler really starts. A claim
        made more than :attr:`start_within` seconds ago never starts (its lease may be
        running out, or another worker may need it): it waits in :attr:`lapsed` to be
        given back."""
        waiting, running = self.waiting, self.running
        if not waiting or len(running) >= self.concurrency:
            return
        loop = asyncio.get_running_loop()
        at = self.clock.now()
        fresh = at - self.start_within
        mono = time.monotonic()
        while waiting and len(running) < self.concurrency:
            iid = next(iter(waiting))
            run = waiting.pop(iid)
            if run.claim.started_at < fresh or run.until <= mono:
                self.lapsed.append(run)
                continue
            self._launch(run, at, loop)

    def _launch(self, run: Running, at: float, loop: asyncio.AbstractEventLoop) -> None:
        """Start ``run``'s attempt now (``at``: epoch s, its ``started_at``)."""
        run.claim.started_at = at
        run.task = loop.create_task(self._attempt(run))
        self.running[run.claim.id] = run

    def _hand_on(self, ended: rows.Claim) -> None:
        """Start the oldest fitting standby in the seat ``ended``'s attempt just left
        (``seats.take_standby``)."""
        at = self.clock.now()
        run = take_standby(
            self.standby, ended, at - self.start_within, time.monotonic(), self.lapsed
        )
        if run is not None:
            self._launch(run, at, asyncio.get_running_loop())

    def overdue(self) -> bool:
        """True when a claim waits to be given back: it lapsed, or the oldest waiting
        one was made more than :attr:`start_within` seconds ago."""
        if self.lapsed:
            return True
        too_old = self.clock.now() - self.start_within
        return any(q and next(iter(q.values())).claim.started_at < too_old for q in self._claimed)

    def give_back(self, *, everything: bool = False) -> list[Running]:
        """Take out the claims to give back (``commit.give_back``): the lapsed ones and
        the waiting ones made more than :attr:`start_within` seconds ago (with
        ``everything``: every waiting one)."""
        too_old = self.clock.now() - self.start_within
        out, self.lapsed = self.lapsed, []
        for q in self._claimed:
            old = [r for r in q.values() if everything or r.claim.started_at < too_old]
            for run in old:
                del q[run.claim.id]
            out += old
        return out

    def keep_waiting(self, runs: list[Running]) -> None:
        """Keep claims taken out by :meth:`give_back` (the cycle that was to give them
        back failed): the next one gives them back."""
        self.lapsed[:0] = runs

    def unsettled(self) -> bool:
        """True while a claim waits (for a slot, or to be given back) or a finished attempt
        waits for the cycle that commits it."""
        return bool(self.waiting or self.standby or self.lapsed or self.finished)

    def take(self) -> list[tuple[Running, AttemptResult]]:
        """Every attempt finished so far (they leave ``finished``), but those started in
        a seat handed on whose hand-off is not committed yet (``seats.split``)."""
        batch, self.finished = split(self.finished)
        return batch

    def put_back(self, batch: list[tuple[Running, AttemptResult]]) -> None:
        """Return ``batch`` (taken, not committed: the database failed) ahead of the rest."""
        self.finished[:0] = batch

    def held(self) -> dict[int, int]:
        """The fence each running or waiting attempt was claimed under, by instance id."""
        held = {iid: r.claim.fence for iid, r in self.running.items()}
        for q in self._claimed:
            for iid, r in q.items():
                held[iid] = r.claim.fence
        return held

    def lease_check(
        self, *, renew: bool, lease: float
    ) -> Callable[[], tuple[dict[int, int], list[int], float | None]]:
        """A function for the database thread: renew the held attempts' leases (to
        ``lease`` seconds from now) when ``renew``, else only read whether each is still
        held. It returns ``(held, taken, since)`` for :meth:`lease_checked`: the
        ``{instance id: fence}`` it checked, the ids of the instances taken away, and
        (``renew``) the ``time.monotonic()`` before the renewal was sent, else ``None``."""
        held, engine, worker_id = self.held(), self.engine, self.worker_id

        def check() -> tuple[dict[int, int], list[int], float | None]:
            if renew:
                since = time.monotonic()
                with engine.begin() as conn:
                    return held, leases.renew(conn, worker_id, held, lease), since
            with reading(engine) as conn:
                return held, leases.taken_away(conn, worker_id, held), None

        return check

    def lease_checked(self, checked: tuple[dict[int, int], list[int], float | None]) -> None:
        """Apply what a :meth:`lease_check` function returned: cancel the attempts taken
        away; the others, when renewed, get a later self-fencing deadline."""
        held, taken, since = checked
        self.taken_away(taken)
        if since is None:
            return
        gone = set(taken)
        renewed = []
        for iid, fence in held.items():
            run = self.running.get(iid) or self.waiting.get(iid) or self.standby.get(iid)
            if run is not None and iid not in gone and run.claim.fence == fence:
                renewed.append(run)
        self.fence.set(renewed, since)

    def taken_away(self, ids) -> None:
        """Cancel the attempts of instances ``ids`` (a command or another worker took them);
        a waiting one never starts: it ends ``cancelled`` at once."""
        for iid in ids:
            waiting = self.waiting.pop(iid, None) or self.standby.pop(iid, None)
            if waiting is not None:
                why = "cancelled before it started: the instance was paused, killed, moved or taken"
                result = AttemptResult("cancelled", waiting.durable[0], error=why)
                self._finished(waiting, result, ran=False)
                continue
            run = self.running.get(iid)
            if run is not None and not run.cancel.is_set():
                log.info(
                    "instance %d: taken away (command or lease lost); cancelling its attempt",
                    iid,
                    extra={"instance": iid, "flow": run.claim.flow, "state": run.claim.state},
                )
                run.cancel.set("cancelled: the instance was paused, killed, moved or taken over")

    def cancel_all(self, reason: str) -> None:
        """Ask every running attempt to stop (``reason`` is recorded on it)."""
        for run in self.running.values():
            run.cancel.set(reason)

    def _held_runs(self) -> list[Running]:
        """Every attempt holding a lease: running, and claimed ahead (waiting, standby)."""
        return [*self.running.values(), *self.waiting.values(), *self.standby.values()]

    def _lapse(self, run: Running) -> None:
        """``run``'s lease was not renewed in time (``fence``): a waiting claim never
        starts (it is given back); a running attempt is ended now, to be recorded
        ``lost``."""
        iid = run.claim.id
        for q in self._claimed:
            if q.get(iid) is run:
                del q[iid]
                self.lapsed.append(run)
                return
        if run.task is None or run.cancel.is_set() or self.running.get(iid) is not run:
            return
        run.fenced = True
        log.warning(
            "instance %d: lease not renewed in time (database unreachable?); ending its "
            "attempt %.1fs before the lease runs out",
            iid,
            self.fence.margin,
            extra={"instance": iid, "flow": run.claim.flow, "state": run.claim.state},
        )
        run.cancel.set(
            "lost: the worker could not renew its lease (database unreachable); the "
            "handler was ended before the lease ran out",
            grace=self.fence.grace,
        )

    def abort(self) -> None:
        """SIGKILL every handler process group still running (and the descendants that
        left them) and cancel every task: the attempts are left for a worker to record as
        lost once their lease expired (the waiting ones too)."""
        self.refill = False
        reaper.kill_all(signal.SIGKILL)
        for run in self.running.values():
            run.task.cancel()

    def close(self) -> None:
        """Stop the sync handlers' thread pool (queued calls are dropped) and the
        self-fencing timer."""
        self.fence.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _attempt(self, run: Running) -> None:
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
                worker_id=self.worker_id,
                kill_grace=self.kill_grace,
                threads=self._threads,
                load_event=lambda: self.in_db(load_event_payload, self.engine, run.claim.event_id),
            )
        except asyncio.CancelledError:
            self._finished(run, AttemptResult("cancelled", run.durable[0], error="worker aborted"))
            raise
        except Exception as exc:  # noqa: BLE001 - recorded on the attempt, never lost
            error = f"flowrun: {type(exc).__name__}: {exc}"
            result = AttemptResult("error", run.durable[0], error=error)
        if run.fenced and result.outcome == "cancelled":  # ended by the self-fence
            result = AttemptResult(
                "lost", run.durable[0], error=run.cancel.reason, checkpoint=result.checkpoint
            )
        self._finished(run, result)

    def _finished(self, run: Running, result: AttemptResult, *, ran: bool = True) -> None:
        """Hand ``run``'s ``result`` to the loop; ``ran``: its handler ran (it counts in
        :attr:`ends`), else it was cancelled while waiting."""
        if self.on_finished is not None:
            self.on_finished(run.claim, result)
        self.running.pop(run.claim.id, None)
        self.finished.append((run, result))
        if ran:
            self.ends += 1
            if self.standby and self.refill and may_hand_on(run.claim, result):
                self._hand_on(run.claim)
        if self.waiting and self.refill:
            self._refill()
        if self.ended is not None and (
            self.quiet_above is None or len(self.running) <= self.quiet_above
        ):
            self.ended.set()
