"""The sensor hub: every sensor under a lease, the rules, the watcher and flow reload.

Each sensor (``"<flow>.<sensor>"``) runs in the one daemon holding its lease in the
``sensors`` table (claimed when free or expired, renewed every ``lease / 3`` seconds,
released on stop). The rule engine runs in every daemon; each event is still handled
once (see ``runner.sensors.rules``). The watcher and flow hot reload are
``runner.sensors.watch``; how parts are kept running, ``runner.sensors.keep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.labels import HOST, covers
from runner.sensors.base import Sensor, first_of, log
from runner.sensors.clock import ClockSensor
from runner.sensors.deadlines import DeadlineWatch
from runner.sensors.deliver import LEASE, Deliverer
from runner.sensors.events import LeaseLost, claim_leases, pending_events, release_leases
from runner.sensors.files import FilesSensor
from runner.sensors.keep import Keep, keep_retrying
from runner.sensors.lifecycle import LifecycleSensor
from runner.sensors.rules import RuleEngine
from runner.sensors.tail import TailSensor
from runner.sensors.watch import FlowWatch
from runner.sensors.webhook import WebhookSensor
from runner.store.data_version import CommitBell, commit_bell, data_version
from runner.store.db_errors import short_error
from runner.store.deliveries import untried
from runner.store.lifecycle_events import declare_flows, forget

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.registry import FlowRegistry

SENSOR_TYPES: dict[str, type[Sensor]] = {
    "files": FilesSensor,
    "tail": TailSensor,
    "every": ClockSensor,
    "cron": ClockSensor,
    "lifecycle": LifecycleSensor,
    "webhook": WebhookSensor,
}


#: While a ``lifecycle`` sensor exists on SQLite (seconds): the shortest time between two
#: looks of the rules woken by a commit (the commit bell), and their longest wait where
#: there is no bell (no inotify). A transition reaches its alert about this soon
#: (``bench/alerts.py``); an idle daemon, which commits nothing, is not woken at all.
LIFECYCLE_POLL = 0.02
#: Seconds between the rules' looks on an idle SQLite file read through the commit bell
#: (a safety net: any commit, another daemon's too, rings the bell at once).
RULES_FALLBACK = 2.0


@dataclass
class _Running:
    sensor: Sensor
    version: str
    stop: asyncio.Event
    task: asyncio.Task[Any]


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
        watch: the watcher and flow reload (``runner.sensors.watch.FlowWatch``).
    """

    def __init__(
        self,
        engine: Engine,
        registry: FlowRegistry,
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
        #: sends the rules' exec and webhook actions (``runner.sensors.deliver``); the
        #: rules hand it the deliveries they queue (claimed by this daemon)
        self.deliverer = Deliverer(engine, registry, worker_id)
        self.rules = RuleEngine(engine, registry, deliver_as=(worker_id, LEASE))
        #: acts on missed deadlines (``runner.sensors.deadlines``)
        self.deadlines = DeadlineWatch(engine, registry, worker_id)
        self.deadlines.on_missed = self._deadlines_missed
        self._running: dict[str, _Running] = {}
        self._rules_kick = asyncio.Event()
        self.watch = FlowWatch(self)
        self._keep: Keep = keep_retrying
        self.events_stored: Counter[str] = Counter()
        #: this daemon's labels (``runner.labels``): a sensor whose ``runs_on`` they do
        #: not cover is never leased here; ``host`` is put in files and tail events
        self.labels: dict[str, str] = {HOST: socket.gethostname()}

    # -- public -----------------------------------------------------------------------

    def kick(self) -> None:
        """Run the rules now (on the hub's loop): an event was stored, maybe elsewhere."""
        self._rules_kick.set()

    def pending(self) -> bool:
        """True while a sensor of this daemon holds unstored input (a file settling), any
        event is not handled yet, or a delivery was never tried (blocking: ``COUNT``
        queries)."""
        if any(r.sensor.busy() for r in self._running.values()):
            return True
        return pending_events(self.engine) > 0 or untried(self.engine) > 0

    def running(self) -> list[str]:
        """Names of the sensors this daemon runs now."""
        return sorted(n for n, r in self._running.items() if not r.task.done())

    def held_sensors(self) -> list[Sensor]:
        """The sensors this daemon holds the lease of (running, or restarting)."""
        return [r.sensor for r in self._running.values()]

    async def run(self, stop: asyncio.Event, keep: Keep | None = None) -> None:
        """Run until ``stop`` is set; then stop the sensors and release their leases.

        Each part (the sensor leases, each sensor, the rules, the watcher with flow
        reload) runs through ``keep``, which restarts it when it fails: the daemon passes
        its supervisor's (``runner.service.supervisor.Supervisor.keep``); the default
        retries every second. A database outage stops no part for good. Cancelled (the
        daemon aborts, or its stop's moment is over), it cancels its parts and returns at
        once, waiting for no database: what it held expires.
        """
        self._keep = keep or keep_retrying
        rules_task = asyncio.ensure_future(
            self._keep("rules", lambda: self._rules_loop(stop), stop)
        )
        watch_task = asyncio.ensure_future(
            self._keep("watcher and flow reload", lambda: self.watch.run(stop), stop)
        )
        deliver_task = asyncio.ensure_future(
            self._keep("deliveries", lambda: self.deliverer.run(stop), stop)
        )
        deadline_task = asyncio.ensure_future(
            self._keep("deadlines", lambda: self.deadlines.run(stop), stop)
        )
        parts = [watch_task, rules_task, deliver_task, deadline_task]
        try:
            await self._keep("sensor leases", lambda: self._lease_loop(stop), stop)
        except BaseException:  # aborted (cancelled): nothing is waited for, nothing
            for task in parts + [r.task for r in self._running.values()]:  # handed back
                task.cancel()  # (leases and deliveries expire; stored events wait)
            raise
        await self._stop_sensors(list(self._running))
        for task in parts:
            task.cancel()
        # not ``await task`` each: an abort (this task cancelled) while stopping must end
        # the stop at once, not be taken for the part's own cancellation
        await asyncio.wait(parts)
        for task in parts:
            if not task.cancelled():
                task.exception()  # retrieved: the part's keep logged it
        self.rules.deliver_as = None  # the deliverer has stopped: queued free
        await self._drain_rules()
        self.deliverer.hand(self.rules.handed)
        self.rules.handed = []
        try:  # handed over but not sent: due at once for any daemon
            await asyncio.to_thread(self.deliverer.give_back)
        except DBAPIError as exc:
            log.warning("deliveries not given back (%s); their leases expire", short_error(exc))
        try:
            await asyncio.to_thread(release_leases, self.engine, self.worker_id)
        except DBAPIError as exc:
            log.warning("sensor leases not released (%s); they expire", short_error(exc))

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        """Claim and renew sensor leases every ``lease / 3`` s; set :attr:`ready` once the
        watcher runs and every sensor held here has reconciled."""
        await first_of(self.watch.watching.wait(), stop.wait())
        while not stop.is_set():
            await self.leases()
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

    def _deadlines_missed(self) -> None:
        """Deadlines were acted on: their events wait for the rules, the instances moved
        for the worker."""
        self.kick()
        if self.on_work is not None:
            self.on_work()

    # -- sensors and leases -------------------------------------------------------------

    def desired(self) -> dict[str, tuple[Any, Any]]:
        """``"<flow>.<sensor>"`` -> (flow, SensorSpec) for every loaded flow, but the
        sensors whose ``runs_on`` this daemon's labels do not cover."""
        return {
            f"{flow.name}.{sname}": (flow, spec)
            for flow in self.registry.flows.values()
            for sname, spec in (flow.sensors or {}).items()
            if covers(self.labels, getattr(spec, "runs_on", None))
        }

    def make_sensor(self, name: str, flow: CompiledFlow, spec: Any) -> Sensor:
        cls = SENSOR_TYPES[spec.kind]
        sensor = cls(self.engine, name, flow, spec, self.worker_id, self._rules_kick.set)
        sensor.host = self.labels.get(HOST, "")
        sensor.tally = self.events_stored
        return sensor

    async def leases(self) -> None:
        """Claim/renew leases; start sensors we hold, stop those we lost or that changed."""
        desired = self.desired()
        declare_flows(self.engine, self.registry)  # lifecycle events of the flows loaded
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
            await asyncio.to_thread(forget, self.engine, gone)
        for name in sorted(held - set(self._running)):
            flow, spec = desired[name]
            sensor = self.make_sensor(name, flow, spec)
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
        tasks = [r.task for r in stopping]
        try:
            if tasks:
                await asyncio.wait(tasks, timeout=10)
        finally:  # the late ones, or all of them when this stop is aborted (cancelled)
            for task in tasks:
                task.cancel()

    # -- rules -----------------------------------------------------------------------

    def _lifecycle(self) -> bool:
        """Whether a loaded flow has a ``lifecycle`` sensor."""
        flows = self.registry.flows.values()
        return any(s.kind == "lifecycle" for f in flows for s in (f.sensors or {}).values())

    async def _rules_loop(self, stop: asyncio.Event) -> None:
        """Handle pending events until ``stop``; a database error ends it (``keep``
        restarts it).

        Between looks it waits for a kick (a sensor of this daemon stored an event) or
        ``poll`` seconds (events stored by other daemons). On SQLite the commit bell
        (any commit, another daemon's too) wakes it instead, at most one look a ``poll``
        (a ``LIFECYCLE_POLL`` with a lifecycle sensor: transitions are events stored by
        any commit, of this daemon's worker too), and an idle file rings nothing (a look
        every ``RULES_FALLBACK`` s at most); a look is skipped while nobody committed
        anything since the last one (``runner.store.data_version``): it would find what
        that one found. PostgreSQL's notifications wake the rules instead."""
        changes = data_version(self.engine)
        bell = commit_bell(self.engine) if changes is not None else None
        rung = asyncio.Event()
        loop = asyncio.get_running_loop()
        if bell is not None:
            loop.add_reader(bell.fd, _ring, bell, rung)
        try:
            while not stop.is_set():
                before = changes.read() if changes is not None else None
                rung.clear()  # a commit from here on rings for the next look
                looked = loop.time()
                seen, acted = await asyncio.to_thread(self.rules.handle_pending)
                handed, self.rules.handed = self.rules.handed, []
                self.deliverer.hand(handed)
                if acted:
                    self.deliverer.kick()
                if acted and self.on_work is not None:
                    self.on_work()
                if seen >= self.rules.batch:
                    continue
                lifecycle = changes is not None and self._lifecycle()
                while not (self._rules_kick.is_set() or stop.is_set()):
                    if bell is not None:
                        # a commit (anyone's) rings; an idle file rings nothing, so the
                        # loop sleeps RULES_FALLBACK; at most one look a LIFECYCLE_POLL
                        # (a lifecycle sensor's events come with transitions) or a poll
                        spacing = LIFECYCLE_POLL if lifecycle else self.poll
                        fallback = self.poll if lifecycle else max(self.poll, RULES_FALLBACK)
                        await first_of(
                            self._rules_kick.wait(), stop.wait(), rung.wait(), timeout=fallback
                        )
                        if rung.is_set():
                            await asyncio.sleep(max(0.0, looked + spacing - loop.time()))
                    else:
                        wait = min(self.poll, LIFECYCLE_POLL) if lifecycle else self.poll
                        await first_of(self._rules_kick.wait(), stop.wait(), timeout=wait)
                    if before is None or changes is None or changes.read() != before:
                        break
                self._rules_kick.clear()
        finally:
            if bell is not None:
                loop.remove_reader(bell.fd)
                bell.close()
            if changes is not None:
                changes.close()


def _ring(bell: CommitBell, rung: asyncio.Event) -> None:
    """The commit bell rang (a commit, anyone's): forget it and wake the rules."""
    bell.drain()
    rung.set()
