"""The sensor hub: one watcher, every sensor under a lease, the rules, flow hot reload.

One ``watchfiles.awatch`` per daemon covers the flows folder and every folder a sensor
needs (files folders, the folders of tailed logs); it is restarted when that set changes.
Each sensor (``"<flow>.<sensor>"``) runs in the one daemon holding its lease in the
``sensors`` table (claimed when free or expired, renewed every ``lease / 3`` seconds,
released on stop). The rule engine runs in every daemon; each event is still handled
once (see ``runner.sensors.rules``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from watchfiles import awatch

from runner.flowspec.registry import SUFFIXES
from runner.sensors.base import FileChange, Sensor, first_of, log
from runner.sensors.clock import ClockSensor
from runner.sensors.events import LeaseLost, claim_leases, pending_events, release_leases
from runner.sensors.files import FilesSensor
from runner.sensors.rules import RuleEngine
from runner.sensors.tail import TailSensor
from runner.store import create
from runner.store.db import short_error

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

#: ``keep(name, run, stop)``: runs the coroutine function ``run`` until it returns or
#: ``stop`` is set, restarting it when it fails (``runner.service.supervisor``).
Keep = Callable[[str, Callable[[], Awaitable[object]], asyncio.Event], Awaitable[None]]

SENSOR_TYPES: dict[str, type[Sensor]] = {
    "files": FilesSensor,
    "tail": TailSensor,
    "every": ClockSensor,
    "cron": ClockSensor,
}


@dataclass
class _Running:
    sensor: Sensor
    version: str
    stop: asyncio.Event
    task: asyncio.Task


class SensorHub:
    """Runs the sensors, rules and flow reload of one daemon.

    Args:
        engine: the database.
        registry: the daemon's ``FlowRegistry`` (reloaded in place on flow edits).
        worker_id: this daemon's id (the sensor lease holder).
        lease: sensor lease length in seconds (renewed every ``lease / 3``).
        force_polling: poll the file system instead of inotify & co (``None``: watchfiles'
            default, i.e. the ``WATCHFILES_FORCE_POLLING`` variable, or any files sensor
            declaring ``force_polling: true``).
        debounce: watcher batch limit in ms; step: watcher quiet period in ms.
        poll: seconds between looks for events stored by other daemons.

    Attributes:
        ready: set once the watcher runs and every sensor this daemon holds has stored its
            start-up reconciliation (existing files, tail backlog, a missed clock tick).
        on_work: called (no arguments, in the event loop) after rules created or changed
            instances, so the worker can claim at once instead of at its next poll.
        events_stored: events stored per sensor name by this hub's sensors (metrics).
    """

    def __init__(
        self,
        engine: Engine,
        registry: Any,
        worker_id: str,
        lease: float = 15.0,
        *,
        force_polling: bool | None = None,
        debounce: int = 10,
        step: int = 5,
        poll: float = 0.5,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.worker_id = worker_id
        self.lease = lease
        self.force_polling = force_polling
        self.debounce = debounce
        self.step = step
        self.poll = poll
        self.ready = asyncio.Event()
        self.on_work: Callable[[], None] | None = None
        self.rules = RuleEngine(engine, registry)
        self._running: dict[str, _Running] = {}
        self._rules_kick = asyncio.Event()
        self._watch_restart = asyncio.Event()
        self._watching = asyncio.Event()
        self._folders: tuple[Path, ...] = ()
        self._reload_pending: set[str] = set()
        self._unrecorded: set[str] = set()  # reloaded flows whose version is not stored yet
        self._keep: Keep = _keep_retrying
        self.events_stored: Counter[str] = Counter()

    # -- public -----------------------------------------------------------------------

    def kick(self) -> None:
        """Run the rules now (on the hub's loop): an event was stored, maybe elsewhere."""
        self._rules_kick.set()

    def pending(self) -> bool:
        """True while a sensor of this daemon holds unstored input (a file settling) or
        any event is not handled yet (blocking: one ``COUNT`` query)."""
        if any(r.sensor.busy() for r in self._running.values()):
            return True
        return pending_events(self.engine) > 0

    def running(self) -> list[str]:
        """Names of the sensors this daemon runs now."""
        return sorted(n for n, r in self._running.items() if not r.task.done())

    async def run(self, stop: asyncio.Event, keep: Keep | None = None) -> None:
        """Run until ``stop`` is set; then stop the sensors and release their leases.

        Each part (the sensor leases, each sensor, the rules, the watcher with flow
        reload) runs through ``keep``, which restarts it when it fails: the daemon passes
        its supervisor's (``runner.service.supervisor.Supervisor.keep``); the default
        retries every second. A database outage stops no part for good.
        """
        self._keep = keep or _keep_retrying
        rules_task = asyncio.ensure_future(
            self._keep("rules", lambda: self._rules_loop(stop), stop)
        )
        watch_task = asyncio.ensure_future(
            self._keep("watcher and flow reload", lambda: self._watch_loop(stop), stop)
        )
        try:
            await self._keep("sensor leases", lambda: self._lease_loop(stop), stop)
        finally:
            await self._stop_sensors(list(self._running))
            for task in (watch_task, rules_task):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._drain_rules()
            try:
                await asyncio.to_thread(release_leases, self.engine, self.worker_id)
            except DBAPIError as exc:
                log.warning("sensor leases not released (%s); they expire", short_error(exc))

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        """Claim and renew sensor leases every ``lease / 3`` s; set :attr:`ready` once the
        watcher runs and every sensor held here has reconciled."""
        await first_of(self._watching.wait(), stop.wait())
        while not stop.is_set():
            await self._leases()
            if not self.ready.is_set():
                for r in list(self._running.values()):
                    await first_of(r.sensor.started.wait(), stop.wait())
                if not stop.is_set():
                    self.ready.set()
                    log.info("sensors ready: %s", ", ".join(self.running()) or "none held here")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.lease / 3)

    async def _drain_rules(self) -> None:
        """On a graceful stop, act on the events the sensors stored up to the end (a clock
        tick or a file seen just before the stop), so none waits for the next start."""
        try:
            for _ in range(100):  # bounded: a stop must not hang on an endless backlog
                seen, acted = await asyncio.to_thread(self.rules.handle_pending)
                if acted and self.on_work is not None:
                    self.on_work()
                if seen < self.rules.batch:
                    break
        except Exception as exc:  # noqa: BLE001 - stored events stay for the next start
            log.warning("rules: events left for the next start (%s)", short_error(exc))

    # -- sensors and leases -------------------------------------------------------------

    def _desired(self) -> dict[str, tuple[Any, Any]]:
        """``"<flow>.<sensor>"`` -> (flow, SensorSpec) for every loaded flow."""
        return {
            f"{flow.name}.{sname}": (flow, spec)
            for flow in self.registry.flows.values()
            for sname, spec in (flow.sensors or {}).items()
        }

    def _make(self, name: str, flow: CompiledFlow, spec: Any) -> Sensor:
        cls = SENSOR_TYPES[spec.kind]
        sensor = cls(self.engine, name, flow, spec, self.worker_id, self._rules_kick.set)
        sensor.tally = self.events_stored
        return sensor

    async def _leases(self) -> None:
        """Claim/renew leases; start sensors we hold, stop those we lost or that changed."""
        desired = self._desired()
        held = await asyncio.to_thread(
            claim_leases, self.engine, desired, self.worker_id, self.lease
        )
        stale = [
            n
            for n, r in self._running.items()
            if n not in held or r.version != desired[n][0].version or r.task.done()
        ]
        await self._stop_sensors(stale)
        gone = [n for n in stale if n not in desired]
        if gone:
            await asyncio.to_thread(release_leases, self.engine, self.worker_id, gone)
        for name in sorted(held - set(self._running)):
            flow, spec = desired[name]
            sensor = self._make(name, flow, spec)
            stop = asyncio.Event()
            task = asyncio.ensure_future(self._run_sensor(sensor, stop))
            self._running[name] = _Running(sensor, flow.version, stop, task)

    async def _run_sensor(self, sensor: Sensor, stop: asyncio.Event) -> None:
        """Run one sensor through ``keep`` (restarted on failure, from its stored cursor)
        until ``stop``; a lost lease ends it (the lease loop decides what runs where)."""

        async def once() -> None:
            try:
                await sensor.run(stop)
            except LeaseLost as exc:
                log.info("%s; stopping it here", exc)
            finally:
                sensor.started.set()  # never hold up readiness with a failed sensor

        await self._keep(f"sensor {sensor.name}", once, stop)

    async def _stop_sensors(self, names: Iterable[str]) -> None:
        stopping = [self._running.pop(n) for n in names if n in self._running]
        for r in stopping:
            r.stop.set()
            r.sensor.kick()
        for r in stopping:
            try:
                await asyncio.wait_for(r.task, 10)
            except (TimeoutError, asyncio.CancelledError):
                r.task.cancel()

    # -- rules -----------------------------------------------------------------------

    async def _rules_loop(self, stop: asyncio.Event) -> None:
        """Handle pending events until ``stop``; a database error ends it (``keep``
        restarts it)."""
        while not stop.is_set():
            seen, acted = await asyncio.to_thread(self.rules.handle_pending)
            if acted and self.on_work is not None:
                self.on_work()
            if seen >= self.rules.batch:
                continue
            await first_of(self._rules_kick.wait(), stop.wait(), timeout=self.poll)
            self._rules_kick.clear()

    # -- the watcher and flow reload ---------------------------------------------------

    def _watch_folders(self) -> tuple[Path, ...]:
        """The flows folder plus every sensor folder, outermost only (the watch is
        recursive), created when missing."""
        folders = {Path(self.registry.folder).absolute()}
        for name, (flow, spec) in self._desired().items():
            sensor = self._make(name, flow, spec)
            folders.update(sensor.folders())
        out: list[Path] = []
        for folder in sorted(folders, key=lambda p: len(p.parts)):
            if not any(folder == o or o in folder.parents for o in out):
                out.append(folder)
        for folder in out:
            folder.mkdir(parents=True, exist_ok=True)
        return tuple(sorted(out))

    def _polling(self) -> bool | None:
        if self.force_polling is not None:
            return self.force_polling
        if any(
            spec.kind == "files" and spec.files.force_polling
            for _, spec in self._desired().values()
        ):
            return True
        return None

    async def _watch_loop(self, stop: asyncio.Event) -> None:
        """Watch until ``stop``; a failure ends it (``keep`` restarts it, and the restart
        rescans what changed meanwhile and retries a flow reload that failed)."""
        while not stop.is_set():
            self._watch_restart.clear()
            try:
                await self._watch_once(stop)
            finally:
                self._watching.set()  # never hold up readiness with a failed watcher

    async def _watch_once(self, stop: asyncio.Event) -> None:
        self._folders = self._watch_folders()
        quit_watch = asyncio.Event()
        relay = asyncio.ensure_future(_relay(quit_watch, stop, self._watch_restart))
        changes = awatch(
            *self._folders,
            watch_filter=None,
            debounce=self.debounce,
            step=self.step,
            stop_event=quit_watch,
            force_polling=self._polling(),
            recursive=True,
        )
        nxt = asyncio.ensure_future(anext(changes))
        try:
            # The watcher exists once the generator ran its first step; only then may
            # sensors scan, or a file dropped in between would be missed.
            for _ in range(3):
                await asyncio.sleep(0)
            if nxt.done() and nxt.exception() is not None:
                raise nxt.exception()  # type: ignore[misc]
            if self._watching.is_set():  # a restart: what changed meanwhile is rescanned
                for r in self._running.values():
                    if isinstance(r.sensor, FilesSensor):
                        r.sensor.request_scan()
                    else:
                        r.sensor.kick()
            self._watching.set()
            # flow files edited since they were read (before this watcher existed: at
            # start, after the daemon's load) and reloads the database refused before
            missed = self._reload_pending.union(self.registry.stale())
            if missed:
                await self._reload(sorted(missed))
            log.debug("watching %s", ", ".join(map(str, self._folders)))
            while True:
                try:
                    batch = await nxt
                except StopAsyncIteration:
                    return
                nxt = asyncio.ensure_future(anext(changes))
                await self._dispatch(sorted(batch, key=lambda c: (c[1], c[0])))
        finally:
            quit_watch.set()
            relay.cancel()
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
            await changes.aclose()

    async def _dispatch(self, batch: list[FileChange]) -> None:
        flows_dir = Path(self.registry.folder).absolute()
        reload = {p for _, p in batch if Path(p).parent == flows_dir and Path(p).suffix in SUFFIXES}
        for r in list(self._running.values()):
            prefixes = [str(f) + os.sep for f in r.sensor.folders()]
            mine = [c for c in batch if c[1].startswith(tuple(prefixes))]
            if mine:
                r.sensor.on_changes(mine)
        if reload:
            await self._reload(sorted(reload))

    async def _reload(self, paths: list[str]) -> None:
        """Reload edited flow files; record new versions; restart their sensors.

        When the database refuses the new versions, the paths are kept and reloaded
        again when the watcher restarts (the error propagates to ``keep``)."""
        self._reload_pending.update(paths)
        before = {name: flow.version for name, flow in self.registry.flows.items()}
        for error in self.registry.reload(paths):
            log.error("flow not reloaded: %s", error)
        changed = [f for n, f in self.registry.flows.items() if before.get(n) != f.version]
        self._unrecorded.update(f.name for f in changed)
        pending = [f for n, f in self.registry.flows.items() if n in self._unrecorded]
        if pending:
            await asyncio.to_thread(_record_versions, self.engine, pending)
            self._unrecorded.clear()
            for flow in changed:
                log.info("flow %s reloaded (version %s)", flow.name, flow.version)
        self._reload_pending.difference_update(paths)
        for name in sorted(set(before) - set(self.registry.flows)):
            log.info("flow %s removed", name)
        await self._leases()
        if self._watch_folders() != self._folders:
            self._watch_restart.set()


def _record_versions(engine: Engine, flows: list[CompiledFlow]) -> None:
    with engine.begin() as conn:
        for flow in flows:
            create.record_version(conn, flow)


async def _keep_retrying(
    name: str, run: Callable[[], Awaitable[object]], stop: asyncio.Event
) -> None:
    """The default ``keep`` without a supervisor: restart ``run`` a second after a
    failure (one log line), until it returns or ``stop`` is set."""
    while True:
        try:
            await run()
            return
        except DBAPIError as exc:
            log.warning("%s: database unavailable (%s); restarting it", name, short_error(exc))
        except Exception:
            log.exception("%s failed; restarting it", name)
        if stop.is_set():
            return
        await first_of(stop.wait(), timeout=1.0)


async def _relay(out: asyncio.Event, *events: asyncio.Event) -> None:
    await first_of(*(e.wait() for e in events))
    out.set()
