"""The daemon's pruner: retention applied every few minutes, by one daemon at a time.

One more supervised part of ``flowrun --daemon`` (``runner.service.daemon``). Every
:attr:`Pruner.every` seconds it takes the pruner's lease (a row of the sensors' lease
table named :data:`LEASE_NAME`, claimed and renewed like a sensor's:
``runner.sensors.events.claim_leases``), so on a PostgreSQL fleet one daemon prunes at a
time; the others find the lease held and wait for the next round. The prune itself
(``runner.ops.prune``) runs on a thread in short paced transactions, renewing the lease
as it goes and ending early when the daemon stops or the lease is lost. On SQLite it then
gives the freed pages back to the file system a step at a time
(``runner.store.space.vacuum_step``); PostgreSQL's autovacuum does that job there, and
where it is off (the server's setting, or a table's) the round ends with a ``VACUUM
(ANALYZE)`` of the tables it leaves alone (``runner.store.space.vacuum_tables``), one
WARNING saying so at the first: without it the database grows for ever.

A database outage fails the round; the supervisor logs one line and restarts the part,
which tries again (nothing of a round needs finishing: a prune is idempotent).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.ops.prune import Pacing, prune, resolved, rules_for, text
from runner.retention import DEFAULT, EVENT_WINDOW, Retention
from runner.sensors.events import claim_leases, release_leases
from runner.store import space
from runner.store.db_errors import short_error
from runner.store.dialect import dialect_of

if TYPE_CHECKING:
    from runner.flowspec.registry import FlowRegistry

log = logging.getLogger("flowrun.pruner")

#: The pruner's lease in the ``sensors`` table (a ``:`` no flow or sensor name has).
LEASE_NAME = "flowrun:pruner"

#: Seconds between rounds, and before the first one (after the daemon's start-up).
EVERY = 300.0
FIRST_AFTER = 5.0

#: Bytes the attempt logs of a SQLite database may take unless ``--log-store-max`` says.
LOG_STORE_MAX = 1 << 30

#: Pages given back per vacuum step (SQLite pages are 4 KiB: 8 MiB a step).
VACUUM_PAGES = 2000


class Pruner:
    """Runs retention rounds until stopped.

    Args:
        engine: the database.
        registry: the daemon's ``FlowRegistry`` (each round reads the flows loaded then).
        worker_id: this daemon's id (the lease holder).
        lease: seconds the lease lasts without renewal (renewed every third of it).
        default: the daemon's retention (``--retention``).
        events: seconds handled events are kept (``--event-retention``; ``None``: forever).
        every: seconds between rounds; first_after: before the first.
        pacing: the prune's batch size and rest (``runner.ops.prune.Pacing``).
        log_store_max: bytes all attempt logs may take (``--log-store-max``): ``None``
            means :data:`LOG_STORE_MAX` on SQLite and no bound on PostgreSQL; 0 no bound.

    Attributes:
        pruned: rows deleted here per kind (``flowrun_pruned_rows_total``).
        rounds: rounds this daemon ran while holding the lease.
    """

    def __init__(
        self,
        engine: Engine,
        registry: FlowRegistry,
        worker_id: str,
        lease: float,
        *,
        default: Retention = DEFAULT,
        events: float | None = EVENT_WINDOW,
        every: float = EVERY,
        first_after: float = FIRST_AFTER,
        pacing: Pacing | None = None,
        log_store_max: int | None = None,
    ) -> None:
        self.engine, self.registry, self.worker_id = engine, registry, worker_id
        self.lease, self.default, self.events = lease, default, events
        self.every, self.first_after = every, first_after
        self.pacing = resolved(pacing, engine)
        if log_store_max is None and dialect_of(engine).in_process:  # SQLite: one file
            log_store_max = LOG_STORE_MAX
        self.log_store_max = log_store_max or None
        self.pruned: Counter[str] = Counter()
        self.rounds = 0
        self._halt = threading.Event()
        self._hinted = False
        self._warned_vacuum = False

    async def run(self, stop: asyncio.Event) -> None:
        """Prune every :attr:`every` seconds until ``stop``; release the lease then.
        Raises ``DBAPIError`` on a database outage (the supervisor restarts it)."""
        watcher = asyncio.ensure_future(self._watch(stop))
        failing = False
        try:
            wait = self.first_after
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    break
                except TimeoutError:
                    pass
                wait = self.every
                # the flows as loaded now, read on the loop (where reloads happen)
                await asyncio.to_thread(self.round, list(self.registry.flows.values()))
        except DBAPIError:
            failing = True  # the supervisor says so (at most every 30 s), not each restart
            raise
        finally:
            watcher.cancel()
            try:
                await asyncio.to_thread(release_leases, self.engine, self.worker_id, [LEASE_NAME])
            except DBAPIError as exc:
                (log.debug if failing else log.warning)(
                    "pruner lease not released (%s); it expires", short_error(exc)
                )

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._halt.set()

    def _holds(self) -> bool:
        return bool(claim_leases(self.engine, [LEASE_NAME], self.worker_id, self.lease))

    def round(self, flows: list[Any] | None = None) -> dict[str, int] | None:
        """One round (blocking): take the lease, prune by the rules of ``flows`` (the
        ``CompiledFlow`` s loaded; default the registry's), give pages back. Returns the
        counts, or ``None`` when another daemon holds the lease."""
        if not self._holds():
            return None
        self.rounds += 1
        renewed = [time.monotonic()]
        lost = [False]

        def stopped() -> bool:
            if self._halt.is_set() or lost[0]:
                return True
            if time.monotonic() - renewed[0] > self.lease / 3:
                renewed[0] = time.monotonic()
                lost[0] = not self._holds()
            return lost[0]

        pacing = Pacing(
            batch=self.pacing.batch,
            rest=self.pacing.rest,
            min_rest=self.pacing.min_rest,
            sleep=self._halt.wait,
            stopped=stopped,
        )
        if flows is None:
            flows = list(self.registry.flows.values())
        rules = rules_for(flows, self.default, events=self.events, log_store_max=self.log_store_max)
        t0 = time.monotonic()
        counts = prune(self.engine, rules, pacing=pacing, on_step=self.pruned.update)
        if any(counts.values()):
            log.info("%s in %.1fs", text(counts, dry_run=False), time.monotonic() - t0)
        self._give_back(stopped)
        return counts

    def _give_back(self, stopped) -> None:
        """SQLite: return free pages to the file system in paced steps. PostgreSQL:
        vacuum the tables autovacuum leaves alone."""
        mode = space.auto_vacuum(self.engine)
        if mode is None:
            self._vacuum(stopped)
            return
        if mode != space.INCREMENTAL:
            if not self._hinted and space.free_pages(self.engine):
                self._hinted = True
                log.warning(
                    "this SQLite file was made without auto-vacuum: pruned space is reused "
                    "but the file does not shrink; `flowrun prune --vacuum` converts it once"
                )
            return
        while not stopped():
            t0 = time.monotonic()
            if space.vacuum_step(self.engine, VACUUM_PAGES) <= VACUUM_PAGES:
                return
            rest = (time.monotonic() - t0) * (self.pacing.rest or 0.0)
            self._halt.wait(max(self.pacing.min_rest, rest))

    def _vacuum(self, stopped) -> None:
        """PostgreSQL: ``VACUUM (ANALYZE)`` the tables autovacuum leaves alone (none
        while it runs), saying so once."""
        tables = space.unvacuumed(self.engine)
        if not tables:
            return
        if not self._warned_vacuum:
            self._warned_vacuum = True
            log.warning(
                "PostgreSQL's autovacuum is off for %s: the pruner vacuums them after each "
                "round (turn autovacuum on to leave it that work)",
                ", ".join(tables),
            )
        t0 = time.monotonic()
        done = space.vacuum_tables(self.engine, tables, stopped)
        log.info("vacuumed %d tables in %.1fs", len(done), time.monotonic() - t0)
