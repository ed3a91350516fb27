"""``flowrun --daemon``: the worker, the sensors and rules, and flow reload, in one process.

Signals follow huey's consumer and Stator's ``runstator``: the handlers only set flags.
SIGINT or SIGTERM once → graceful stop (no new claims, running attempts get ``grace``
seconds, locks released, exit 0); a second SIGINT or SIGTERM → abort at once (handler
process groups are killed; the leases expire and any worker recovers the instances as
``lost``; exit 130 or 143). Every long-lived part runs under one supervisor
(``runner.service.supervisor``): a part that cannot be kept alive stops the daemon with
exit 70. Optional parts: Prometheus metrics, systemd notification, progress and status
lines (``options.ServiceOptions``). The parts that wait for the worker's first cycle wait
at a ``first_cycle.FirstCycle``; the daemon's end is ``stopping`` (``wind_down``,
``exit_code``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine.config import WorkerConfig
from runner.engine.db_thread import DaemonThreads
from runner.engine.worker import Worker
from runner.flowspec.registry import FlowRegistry
from runner.labels import decode
from runner.service.first_cycle import FirstCycle
from runner.service.http_wiring import open_http
from runner.service.logs import attempt_logger
from runner.service.options import Served, ServiceOptions
from runner.service.sdnotify import Notifier, notify_loop
from runner.service.startup import listen_url, preload_hub
from runner.service.stopping import exit_code, wind_down
from runner.service.supervisor import Supervisor
from runner.store.notify import DueListener

if TYPE_CHECKING:
    from runner.sensors.hub import SensorHub
    from runner.service.http_listener import HttpListener
    from runner.service.metrics import AttemptTally, DaemonCollector
    from runner.service.pruner import Pruner

log = logging.getLogger("flowrun.daemon")

#: Threads for the parts' blocking calls (``asyncio.to_thread``), as many as
#: ``ThreadPoolExecutor``'s default on this kind of machine.
IO_THREADS = min(32, (os.cpu_count() or 1) + 4)


#: Seconds without a turn of the worker loop after which it counts as stuck (no watchdog).
LOOP_STALE = 10.0

#: Seconds after the worker's first cycle by which the sensor hub starts at the latest; it
#: starts as soon as the worker has nothing to do (``Worker.quiet``), if that comes first.
HUB_AFTER = 1.0


def _hooks(*hooks: Callable[[Any, Any], None] | None) -> Callable[[Any, Any], None] | None:
    """One ``on_finished`` hook calling each given one (``None`` when none is given)."""
    live = [h for h in hooks if h is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def both(claim: Any, result: Any) -> None:
        for h in live:
            h(claim, result)

    return both


class Part(NamedTuple):
    """One part the supervisor keeps running: its ``name`` (in logs and metrics) and
    ``run`` (a coroutine function; returning ends the part, raising restarts it)."""

    name: str
    run: Callable[[], Awaitable[object]]


@dataclass(eq=False, repr=False)
class Daemon:
    """A worker (and, with ``sensors``, the sensor hub) and the optional parts
    ``options`` asks for, every part under one :class:`Supervisor`: ``await
    Daemon(...).run()`` until stopped or idle. Made on the event loop that runs it.

    Its fields are its parts: made at once (``worker``, ``supervisor``, ``listener``,
    ``tally``, ``collector``, ``http``, ``notifier``), or once the worker's first cycle
    is over (``hub``, ``pruner``), ``None`` when the options leave them out. What runs
    under the supervisor is :meth:`parts`; to add a part, add its field (made in
    ``__post_init__``, or in its run method when it should not delay the first claim) and
    one entry in :meth:`parts` (wrapped in ``gate.later`` when it can wait).

    Raises (on construction):
        ConfigError: the HTTP listener's address cannot be bound, ``--metrics`` and
            ``--http`` name two addresses, an unauthenticated webhook sensor would be served
            beyond loopback, or ``options.listen_url`` is not a PostgreSQL URL or given
            with a SQLite engine.
    """

    engine: Engine
    registry: FlowRegistry | None
    config: WorkerConfig
    options: ServiceOptions = field(default_factory=ServiceOptions)
    sensors: bool = True
    install_signals: bool = True

    worker: Worker = field(init=False)
    supervisor: Supervisor = field(init=False)
    listener: DueListener | None = field(init=False, default=None)  # LISTEN (PostgreSQL)
    tally: AttemptTally | None = field(init=False, default=None)  # --metrics
    collector: DaemonCollector | None = field(init=False, default=None)  # --metrics
    http: HttpListener | None = field(init=False, default=None)  # --metrics, --http
    notifier: Notifier = field(init=False)  # systemd
    hub: SensorHub | None = field(init=False, default=None)  # after the first cycle
    pruner: Pruner | None = field(init=False, default=None)  # after the first cycle

    stop: asyncio.Event = field(init=False)  # set: every part ends
    idle: asyncio.Event = field(init=False)  # after the first cycle, the worker was quiet
    aborted_by: int | None = field(init=False, default=None)  # the second signal's number
    ticked: float | None = field(init=False, default=None)  # the worker loop's last turn
    gate: FirstCycle = field(init=False)  # the worker's first cycle; its task
    outer_tick: Callable[[], None] | None = field(init=False, default=None)  # config's own
    base: Any = field(init=False, default=None)  # the progress line's baseline
    started: float = field(init=False, default=0.0)  # monotonic s, the parts' start

    def __post_init__(self) -> None:
        opts, config = self.options, self.config
        self.stop, self.idle = asyncio.Event(), asyncio.Event()
        self.outer_tick = config.on_tick
        # wake-ups through LISTEN/NOTIFY (PostgreSQL), unless only a transaction pooler is known
        url = listen_url(self.engine, opts.listen_url, config)
        self.config = config = dataclasses.replace(
            config, on_tick=self.on_tick, listen=url is not None
        )
        self.worker = worker = Worker(self.engine, config, idle_hint=self.busy)
        self.gate = FirstCycle(worker, self.stop, self.idle)
        if url is not None:
            self.listener = DueListener(
                url,
                worker.notify_due,
                self.kick_hub if self.with_hub else None,
                application_name=f"flowrun {config.worker_id}",  # as ``flowrun --daemon``
                # names its pool's connections
            )
        self.supervisor = Supervisor(on_fatal=self.fatal)
        if opts.metrics is not None:  # prometheus_client is imported only with --metrics
            from runner.service.metrics import AttemptTally

            self.tally = AttemptTally()
        worker.attempts.on_finished = _hooks(
            self.tally.finished if self.tally else None,
            attempt_logger(config.worker_id) if opts.log_attempts else None,
        )
        if opts.metrics is not None or opts.http is not None:  # wiring: http listener
            hooks = self.registry if self.with_hub else None
            self.http, self.collector = open_http(
                self.engine, opts, worker, self.supervisor, self.tally, hooks, self.kick_hub
            )
        self.notifier = opts.notifier or Notifier()

    @property
    def with_hub(self) -> bool:
        """True when this daemon runs the sensor hub (``sensors`` and flows given)."""
        return self.sensors and self.registry is not None

    def parts(self) -> list[Part]:
        """What runs under the supervisor besides the worker and the hub, in start order;
        a part the options leave out is not listed. Procrastinate's worker starts its
        side tasks from one such list."""
        later, opts = self.gate.later, self.options
        progress = opts.progress and self.config.exit_when_idle
        pruning = opts.prune_every is not None and self.registry is not None
        wanted = [
            (self.listener is not None, Part("listener", later(self.listen))),
            (self.notifier.enabled, Part("systemd notify", self.notify)),
            (self.http is not None, Part("http listener", self.serve_http)),
            (opts.status_every > 0, Part("status line", later(self.status_line))),
            (progress, Part("progress", later(self.progress))),
            (pruning, Part("pruner", later(self.prune))),
        ]
        return [part for on, part in wanted if on]

    # -- the worker's hooks --------------------------------------------------------

    def on_tick(self) -> None:
        """Each turn of the worker loop: it is alive; after its first cycle, the first
        turn with nothing to do sets :attr:`idle`."""
        if self.outer_tick is not None:
            self.outer_tick()
        self.ticked = time.monotonic()
        worker = self.worker
        if not self.idle.is_set() and worker.first_cycle.is_set() and worker.quiet():
            self.idle.set()

    def busy(self) -> bool:
        """The worker's ``idle_hint``: True while the sensors may still create work (not
        started yet, not ready, or events pending)."""
        if self.hub is None:
            return self.with_hub  # sensors not started yet
        return not self.hub.ready.is_set() or self.hub.pending()

    def kick_hub(self) -> None:
        """A notification of new events: the hub looks now."""
        if self.hub is not None:
            self.hub.kick()

    def fatal(self, part: str) -> None:
        """The supervisor gave up on ``part``: stop everything (exit 70)."""
        self.worker.request_stop()
        self.stop.set()

    def on_signal(self, sig: signal.Signals) -> None:
        """SIGINT/SIGTERM: the first stops gracefully, the second aborts."""
        mode = self.worker.request_stop()
        self.stop.set()
        if mode == "graceful":
            log.warning(
                "%s: stopping gracefully (up to %gs for running attempts); again to abort",
                sig.name,
                self.config.grace,
            )
        else:
            if self.aborted_by is None:
                self.aborted_by = int(sig)
            log.warning("%s again: aborting now; open attempts will be recovered as lost", sig.name)

    # -- systemd's view ------------------------------------------------------------

    def ready(self) -> bool:
        """``READY=1``: the hub is ready (or there is none, or 60 s passed)."""
        if not self.with_hub or time.monotonic() - self.started > 60:
            return True
        return self.hub is not None and self.hub.ready.is_set()

    def healthy(self) -> bool:
        """No part given up, the worker task alive and its loop turning (it turns at
        least every second; before its first turn, start-up counts as healthy)."""
        fresh = self.ticked is None or time.monotonic() - self.ticked < LOOP_STALE
        task = self.gate.task
        return self.supervisor.healthy() and not (task is not None and task.done()) and fresh

    def status(self) -> str:
        """systemd's ``STATUS=`` line."""
        worker = self.worker
        return (
            f"running {len(worker.running)}/{self.config.concurrency}, "
            f"committed {worker.stats.committed}" + (", stopping" if worker.stopping else "")
        )

    # -- the parts -----------------------------------------------------------------

    async def start_hub(self) -> None:
        """The sensors, rules and flow reload, once the worker's first cycle is over and
        it has nothing to do (at the latest :data:`HUB_AFTER` s later): neither the first
        claim nor the attempts that follow it wait for their imports and start-up (with
        several daemons starting at once on a busy host, the CPU they take there is the
        workers' own start-up's)."""
        if not await self.gate.quiet(HUB_AFTER):
            return
        await asyncio.to_thread(preload_hub)  # not on the loop: see preload_hub
        if self.gate.over():
            return
        from runner.sensors.hub import SensorHub

        assert self.registry is not None  # with_hub() said so
        hub = SensorHub(self.engine, self.registry, self.config.worker_id, self.config.lease)
        hub.labels = decode(self.config.labels)  # sensors with runs_on: only where covered
        hub.on_work = self.worker.wake
        if self.listener is not None:  # other daemons' events: notifications
            hub.poll = min(self.worker.idle_poll, 3600.0)
        if self.collector is not None:
            self.collector.hub = hub
        self.hub = hub
        gc.freeze()  # what the hub imported lives as long as the process, too
        await hub.run(self.stop, self.supervisor.keep)

    async def listen(self) -> None:
        """LISTEN for due work and new events (PostgreSQL)."""
        assert self.listener is not None
        await self.listener.run(self.stop)

    async def notify(self) -> None:
        """systemd: ``READY=1``, ``STATUS=``, the watchdog, ``STOPPING=1``."""
        await notify_loop(self.notifier, self.ready, self.healthy, self.status, self.stop)

    async def serve_http(self) -> None:
        """Watch the HTTP listener's thread until stopped."""
        assert self.http is not None
        await self.http.watch(self.stop)

    async def status_line(self) -> None:
        """A status line every ``options.status_every`` seconds."""
        from runner.service.progress import status_loop

        committed = lambda: self.worker.stats.committed  # noqa: E731
        await status_loop(self.engine, committed, self.stop, self.options.status_every)

    async def progress(self) -> None:
        """The progress bar or lines until idle (``--exit-when-idle``)."""
        from runner.service.progress import progress_loop

        await progress_loop(self.engine, self.stop, tty=self.options.tty, base=self.base)

    async def prune(self) -> None:
        """Retention rounds (the pruner is made at its first start, imports included)."""
        if self.pruner is None:
            from runner.service.pruner import Pruner

            opts = self.options
            assert opts.prune_every is not None and self.registry is not None
            self.pruner = Pruner(
                self.engine,
                self.registry,
                self.config.worker_id,
                self.config.lease,
                default=opts.retention,
                events=opts.event_retention,
                every=opts.prune_every,
                log_store_max=opts.log_store_max,  # wiring: logs
            )
            if self.collector is not None:
                self.collector.pruner = self.pruner
        await self.pruner.run(self.stop)

    # -- start and stop ------------------------------------------------------------

    async def run(self) -> Served:
        """Run until stopped (a signal, a part given up) or idle; returns how it ended."""
        loop = asyncio.get_running_loop()
        if self.install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.on_signal, sig)
            # the parts' blocking calls (``asyncio.to_thread``) on daemon threads: one stuck
            # on a dead network never keeps the process from exiting
            loop.set_default_executor(DaemonThreads("flowrun-io", IO_THREADS))
        # Everything loaded so far (SQLAlchemy, pydantic, the compiled flows: hundreds of
        # thousands of objects) lives as long as the process: move it out of the collector's
        # sight, so the collections the hot loop's short-lived objects trigger stay cheap
        # (measured: 12 of 16 us of the cost of starting an attempt was the collector).
        gc.freeze()
        gc.enable()  # ``run_daemon`` starts with it off (its imports make no cyclic garbage)
        if self.options.progress and self.config.exit_when_idle:
            from runner.service.progress import baseline

            try:  # what was final before the first claim
                self.base = await baseline(self.engine)
            except DBAPIError:  # counted when the progress line starts (and it says so)
                log.warning("progress: cannot count the instances yet; counting later")
        sup = self.supervisor
        task = asyncio.ensure_future(sup.keep("worker", self.worker.run, restart=False))
        self.gate.task = task
        side: list[asyncio.Future[None]] = []
        if self.with_hub:
            side.append(asyncio.ensure_future(self.start_hub()))
        self.started = time.monotonic()
        for name, run in self.parts():
            side.append(asyncio.ensure_future(sup.keep(name, run, self.stop)))
        try:
            await task
        finally:
            self.stop.set()
            # the database does not answer: the parts are given a moment only
            cut_off = self.aborted_by is not None or self.worker.unreachable
            await wind_down(side, cut_off, self.worker.grace_left)
            if self.install_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            if self.http is not None:
                self.http.close()
            if self.collector is not None:
                self.collector.close()
            self.notifier.close()
        code = exit_code(sup.fatal, self.aborted_by)
        return Served(self.worker, code, sup, self.http.port if self.http else None)


async def serve(
    engine: Engine,
    registry: FlowRegistry | None,
    config: WorkerConfig,
    *,
    install_signals: bool = True,
    sensors: bool = True,
    worker_ready: asyncio.Future[Worker] | None = None,
    options: ServiceOptions | None = None,
) -> Served:
    """Run a :class:`Daemon` until stopped or idle: a worker (and, with ``sensors``, the
    sensor hub), every part under one :class:`Supervisor`.

    Returns a :class:`Served` (the worker's ``stats``, the exit code). ``worker_ready``, if
    given, gets the worker as its result once it exists (the console uses it to stop the
    worker).

    Raises:
        ConfigError: see :class:`Daemon`.
    """
    daemon = Daemon(
        engine,
        registry,
        config,
        options or ServiceOptions(),
        sensors=sensors,
        install_signals=install_signals,
    )
    if worker_ready is not None:
        worker_ready.set_result(daemon.worker)
    return await daemon.run()
