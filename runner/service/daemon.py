"""``flowrun --daemon``: the worker, the sensors and rules, and flow reload, in one process.

Signals follow huey's consumer and Stator's ``runstator``: the handlers only set flags.
SIGINT or SIGTERM once → graceful stop (no new claims, running attempts get ``grace``
seconds, locks released, exit 0); a second SIGINT or SIGTERM → abort at once (handler
process groups are killed; the leases expire and any worker recovers the instances as
``lost``; exit 130 or 143). Every long-lived part runs under one supervisor
(``runner.service.supervisor``): a part that cannot be kept alive stops the daemon with
exit 70. Optional parts: Prometheus metrics, systemd notification, progress and status
lines (``ServiceOptions``).
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine.config import WorkerConfig
from runner.engine.db_thread import DaemonThreads
from runner.engine.worker import Worker
from runner.errors import ConfigError, FlowErrors
from runner.flowspec.registry import FlowRegistry
from runner.flowspec.setup_checks import privilege_errors, setup_warnings
from runner.retention import DEFAULT, EVENT_WINDOW, Retention
from runner.service.logs import attempt_logger
from runner.service.sdnotify import Notifier, notify_loop
from runner.service.supervisor import Supervisor
from runner.store import versions
from runner.store.create import record_version
from runner.store.db import interrupt, redact, short_error
from runner.store.dialect import dialect_of
from runner.store.notify import DueListener, listen_db_url
from runner.store.pooler import pooler_of

if TYPE_CHECKING:
    from runner.sensors.hub import SensorHub

log = logging.getLogger("flowrun.daemon")

#: Threads for the parts' blocking calls (``asyncio.to_thread``), as many as
#: ``ThreadPoolExecutor``'s default on this kind of machine.
IO_THREADS = min(32, (os.cpu_count() or 1) + 4)


def load_registry(engine: Engine, flows_dir: Path) -> FlowRegistry:
    """Load every flow in ``flows_dir`` and store their versions.

    Raises ``FlowErrors`` when any flow file has errors (the daemon refuses to start on a
    broken folder; a later bad edit is reported and the good version kept).
    """
    registry = FlowRegistry(flows_dir, check=privilege_errors)
    errors = registry.load_all()
    if errors:
        raise FlowErrors(errors)
    for flow in registry.flows.values():
        for warning in setup_warnings(flow):  # its attempts will be errors until fixed
            log.warning("%s", warning)
    remember_all(engine, registry)
    from runner.store.lifecycle_events import declare_flows  # wiring: lifecycle events

    declare_flows(engine, registry)  # wiring: lifecycle events, before the hub starts
    return registry


def remember_all(engine: Engine, registry: FlowRegistry) -> None:
    """Record every loaded flow version in the database and the in-process cache."""
    with engine.begin() as conn:
        for flow in registry.flows.values():
            record_version(conn, flow)
            versions.remember(flow)


def preload_hub() -> None:
    """Import the sensor hub's modules, and the asyncio backend of anyio that its file
    watcher (``watchfiles.awatch``) imports at its first step; run on a thread.

    Together ~45 ms of CPU. Imported on the event loop, right after the worker's first
    cycle, they held up the attempts that cycle had just started and the cycles that
    refill their slots: with four daemons starting at once on 2 cores the loop stalled
    for 100-250 ms. On a thread the loop gets the interpreter back within the switch
    interval (5 ms) whenever it has something to run.
    """
    import runner.sensors.hub  # noqa: F401

    try:
        import anyio._backends._asyncio  # noqa: F401 - only a warm-up of watchfiles' import
    except ImportError:  # another anyio layout: the watcher imports what it needs itself
        pass


@dataclass
class ServiceOptions:
    """The optional parts of ``flowrun --daemon``.

    Attributes:
        metrics: ``(host, port)`` to serve Prometheus ``/metrics`` on, or ``None``.
        progress: show progress until idle (``--exit-when-idle``): a rich bar when
            ``tty`` (``None``: stderr is a terminal), else a line every 5 s.
        status_every: seconds between status lines (counts by status, attempts/s).
        log_attempts: one INFO line per finished attempt (``flowrun.attempts``).
        notifier: the systemd notifier (``None``: from the environment).
        prune_every: seconds between the pruner's rounds (``runner.service.pruner``;
            ``None``: no pruner, the default of an embedded worker).
        retention: the pruner's policy for flows without their own (``--retention``).
        event_retention: seconds handled events are kept (``None``: forever).
        listen_url: PostgreSQL: the URL whose connection ``LISTEN``s (``--listen-db``: a
            direct connection to the same database when the engine's goes through a
            transaction-pooling pooler); ``None``: the engine's own URL, or no ``LISTEN``
            at all (polling, with a WARNING) behind such a pooler.
    """

    metrics: tuple[str, int] | None = None
    progress: bool = False
    tty: bool | None = None
    status_every: float = 60.0
    log_attempts: bool = False
    notifier: Notifier | None = None
    prune_every: float | None = None
    retention: Retention = DEFAULT
    event_retention: float | None = EVENT_WINDOW
    listen_url: str | None = None


@dataclass
class Served:
    """How a daemon ended: ``code`` is its exit code (0 clean stop or idle exit, 70 a part
    could not be kept alive, 128 + signal number after an abort by a second signal);
    ``worker`` (its ``stats``), the ``supervisor`` and the metrics port actually bound."""

    worker: Worker
    code: int
    supervisor: Supervisor
    metrics_port: int | None = None


#: Seconds without a turn of the worker loop after which it counts as stuck (no watchdog).
LOOP_STALE = 10.0

#: Turns of the worker loop after which its first cycle is over and what it claimed has
#: started (turn 1 starts the cycle, turn 2 or 3 collects it and starts its attempts):
#: then the sensor hub starts (``serve``).
FIRST_CYCLE_TURNS = 3

#: Seconds after the worker's first cycle by which the sensor hub starts at the latest; it
#: starts as soon as the worker has nothing to do (``Worker.quiet``), if that comes first.
HUB_AFTER = 1.0

EXIT_FATAL = 70  # EX_SOFTWARE (sysexits.h): a part could not be kept alive


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


async def _until(*aws: Awaitable[Any], timeout: float | None = None) -> None:
    """Wait until the first of ``aws`` is done (or ``timeout`` seconds passed); the waits
    made here are cancelled after, a task given is left running."""
    futures = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for made, given in zip(futures, aws, strict=True):
            if made is not given:
                made.cancel()


def _listen_url(engine: Engine, given: str | None, config: WorkerConfig) -> str | None:
    """The URL the daemon ``LISTEN``s on: ``given`` (``--listen-db``), else the engine's own
    unless it goes through a transaction-pooling pooler (then ``None``: the worker polls,
    said in one WARNING); ``None`` on SQLite.

    Raises:
        ConfigError: ``given`` with a database that has no ``NOTIFY`` (SQLite), or a
            ``given`` URL that is not PostgreSQL.
    """
    notify = dialect_of(engine).notify
    if given is not None:
        if not notify:
            raise ConfigError("--listen-db: only for a PostgreSQL --db (SQLite has no LISTEN)")
        url = listen_db_url(given)
        if pooler_of(engine) == "transaction":
            log.info(
                "database %s is reached through a transaction pooling pooler: statements are "
                "not prepared on the server; LISTEN on %s (--listen-db)",
                redact(engine.url.render_as_string(hide_password=False)),
                redact(url),
            )
        return url
    if not notify:
        return None
    if pooler_of(engine) == "transaction":
        every = f"every {config.poll:g}s"
        log.warning(
            "database %s is reached through a transaction pooling pooler: LISTEN cannot "
            "work through it, so this worker is polling for due work %s; give --listen-db "
            "(FLOWRUN_LISTEN_DB) a direct URL of the same database to be woken at once",
            redact(engine.url.render_as_string(hide_password=False)),
            every,
        )
        return None
    return engine.url.render_as_string(hide_password=False)


async def serve(
    engine: Engine,
    registry: FlowRegistry | None,
    config: WorkerConfig,
    *,
    install_signals: bool = True,
    sensors: bool = True,
    worker_ready: asyncio.Future | None = None,
    options: ServiceOptions | None = None,
) -> Served:
    """Run a worker (and, with ``sensors``, the sensor hub) until stopped or idle, every
    part under one :class:`Supervisor`.

    Returns a :class:`Served` (the worker's ``stats``, the exit code). ``worker_ready``, if
    given, gets the worker as its result once it exists (the console uses it to stop the
    worker).

    Raises:
        ConfigError: the metrics address cannot be bound, or ``options.listen_url`` is
            not a PostgreSQL URL or given with a SQLite engine.
    """
    opts = options or ServiceOptions()
    with_hub = sensors and registry is not None
    hub: SensorHub | None = None  # made after the worker's first cycle (``start_hub``)

    def busy() -> bool:
        if hub is None:
            return with_hub  # sensors not started yet
        return not hub.ready.is_set() or hub.pending()

    ticked: list[float] = []  # the worker loop's last turn (``WorkerConfig.on_tick``)
    outer_tick = config.on_tick
    first_cycle = asyncio.Event()  # the worker's first cycle is over: start the rest
    idle = asyncio.Event()  # after it, the worker had nothing to do (``Worker.quiet``)
    turns = 0

    def on_tick() -> None:
        nonlocal turns
        if outer_tick is not None:
            outer_tick()
        if ticked:
            ticked[0] = time.monotonic()
        else:
            ticked.append(time.monotonic())
        if turns < FIRST_CYCLE_TURNS:
            turns += 1
            if turns == FIRST_CYCLE_TURNS:
                first_cycle.set()
        elif not idle.is_set() and worker.quiet():
            idle.set()

    # wake-ups through LISTEN/NOTIFY (PostgreSQL), unless only a transaction pooler is known
    listen_url = _listen_url(engine, opts.listen_url, config)
    listen = listen_url is not None
    config = dataclasses.replace(config, on_tick=on_tick, listen=listen)
    worker = Worker(engine, config, idle_hint=busy)

    def kick_hub() -> None:
        if hub is not None:
            hub.kick()

    listener = None
    if listen_url is not None:
        listener = DueListener(
            listen_url,
            worker.notify_due,
            kick_hub if with_hub else None,
            application_name=f"flowrun {config.worker_id}",  # as ``flowrun --daemon`` names
            # its pool's connections
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    aborted_by: list[int] = []

    def fatal(part: str) -> None:
        worker.request_stop()
        stop.set()

    sup = Supervisor(on_fatal=fatal)
    tally = None
    if opts.metrics is not None:  # prometheus_client is imported only with --metrics
        from runner.service.metrics import AttemptTally

        tally = AttemptTally()
    worker.attempts.on_finished = _hooks(
        tally.finished if tally else None,
        attempt_logger(config.worker_id) if opts.log_attempts else None,
    )
    server = collector = None
    if opts.metrics is not None:
        from runner.service.metrics import DaemonCollector, MetricsServer, registry_for

        collector = DaemonCollector(engine, worker, tally, None, sup)  # hub: start_hub
        server = MetricsServer(*opts.metrics, registry_for(collector))
        try:
            server.start()
        except OSError as exc:
            collector.close()
            raise ConfigError(f"--metrics {opts.metrics[0]}:{opts.metrics[1]}: {exc}") from None
        log.info("metrics on http://%s:%d/metrics", server.host, server.port)
    notifier = opts.notifier or Notifier()
    if worker_ready is not None:
        worker_ready.set_result(worker)

    def on_signal(sig: signal.Signals) -> None:
        mode = worker.request_stop()
        stop.set()
        if mode == "graceful":
            log.warning(
                "%s: stopping gracefully (up to %gs for running attempts); again to abort",
                sig.name,
                config.grace,
            )
        else:
            aborted_by.append(int(sig))
            log.warning("%s again: aborting now; open attempts will be recovered as lost", sig.name)

    if install_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        # the parts' blocking calls (``asyncio.to_thread``) on daemon threads: one stuck
        # on a dead network never keeps the process from exiting
        loop.set_default_executor(DaemonThreads("flowrun-io", IO_THREADS))
    # Everything loaded so far (SQLAlchemy, pydantic, the compiled flows: hundreds of
    # thousands of objects) lives as long as the process: move it out of the collector's
    # sight, so the collections the hot loop's short-lived objects trigger stay cheap
    # (measured: 12 of 16 us of the cost of starting an attempt was the collector).
    gc.freeze()
    gc.enable()  # ``run_daemon`` starts with it off (its imports make no cyclic garbage)
    base = None  # the progress line's baseline: what was final before the first claim
    if opts.progress and config.exit_when_idle:
        from runner.service.progress import baseline

        try:
            base = await baseline(engine)
        except DBAPIError:  # counted when the progress line starts (and it says so)
            log.warning("progress: cannot count the instances yet; counting later")
    worker_task = asyncio.ensure_future(sup.keep("worker", worker.run, restart=False))
    side: list[asyncio.Future] = []

    async def start_hub() -> None:
        """The sensors, rules and flow reload, once the worker's first cycle is over and
        it has nothing to do (at the latest :data:`HUB_AFTER` s later): neither the first
        claim nor the attempts that follow it wait for their imports and start-up (with
        several daemons starting at once on a busy host, the CPU they take there is the
        workers' own start-up's)."""
        nonlocal hub
        await _until(first_cycle.wait(), stop.wait(), worker_task)
        if stop.is_set() or worker_task.done():
            return
        await _until(idle.wait(), stop.wait(), worker_task, timeout=HUB_AFTER)
        await asyncio.to_thread(preload_hub)  # not on the loop: see preload_hub
        if stop.is_set() or worker_task.done():
            return
        from runner.sensors.hub import SensorHub

        hub = SensorHub(engine, registry, config.worker_id, config.lease)
        hub.on_work = worker.wake
        if listen:
            hub.poll = min(worker.idle_poll, 3600.0)  # other daemons' events: notifications
        if collector is not None:
            collector.hub = hub
        gc.freeze()  # what the hub imported lives as long as the process, too
        await hub.run(stop, sup.keep)

    if with_hub:
        side.append(asyncio.ensure_future(start_hub()))
    started = time.monotonic()

    def ready() -> bool:
        if not with_hub or time.monotonic() - started > 60:
            return True
        return hub is not None and hub.ready.is_set()

    def healthy() -> bool:
        """No part given up, the worker task alive and its loop turning (it turns at
        least every second; before its first turn, start-up counts as healthy)."""
        fresh = not ticked or time.monotonic() - ticked[0] < LOOP_STALE
        return sup.healthy() and not worker_task.done() and fresh

    def status() -> str:
        return (
            f"running {len(worker.running)}/{config.concurrency}, "
            f"committed {worker.stats.committed}" + (", stopping" if worker.stopping else "")
        )

    def after_first_cycle(run: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[None]]:
        """``run`` once the worker's first cycle is over: the first claim does not wait for
        the connection or imports of the parts that can start later (the listener looks
        once when it has connected, so nothing sent before is missed)."""

        async def later() -> None:
            await _until(first_cycle.wait(), stop.wait(), worker_task)
            if not (stop.is_set() or worker_task.done()):
                await run()

        return later

    parts: list[tuple[str, Callable[[], Awaitable[object]]]] = []
    if listener is not None:
        parts.append(("listener", after_first_cycle(lambda: listener.run(stop))))
    if notifier.enabled:

        def notify() -> Awaitable[None]:
            return notify_loop(notifier, ready, healthy, status, stop)

        parts.append(("systemd notify", notify))
    if server is not None:
        parts.append(("metrics server", lambda: server.watch(stop)))
    if opts.status_every > 0:

        async def status_line() -> None:
            from runner.service.progress import status_loop

            await status_loop(engine, lambda: worker.stats.committed, stop, opts.status_every)

        parts.append(("status line", after_first_cycle(status_line)))
    if opts.progress and config.exit_when_idle:

        async def progress() -> None:
            from runner.service.progress import progress_loop

            await progress_loop(engine, stop, tty=opts.tty, base=base)

        parts.append(("progress", after_first_cycle(progress)))
    if opts.prune_every is not None and registry is not None:
        pruners: list[Any] = []  # made once, after the first cycle (its imports too)

        async def prune() -> None:
            if not pruners:
                from runner.service.pruner import Pruner

                pruners.append(
                    Pruner(
                        engine,
                        registry,
                        config.worker_id,
                        config.lease,
                        default=opts.retention,
                        events=opts.event_retention,
                        every=opts.prune_every,
                    )
                )
                if collector is not None:
                    collector.pruner = pruners[0]
            await pruners[0].run(stop)

        parts.append(("pruner", after_first_cycle(prune)))
    for name, run in parts:
        side.append(asyncio.ensure_future(sup.keep(name, run, stop)))
    try:
        await worker_task
    finally:
        stop.set()
        # the database does not answer: break off the parts' statements waiting for it,
        # and give them a moment only (their leases expire; events wait for the next start)
        cut_off = bool(aborted_by) or worker.unreachable
        if cut_off:
            interrupt()
        if side:
            done, pending = await asyncio.wait(side, timeout=0.5 if cut_off else 10)
            for task in pending:
                task.cancel()
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    if isinstance(exc, DBAPIError):  # an outage at stop is not a bug: one
                        # line (leases expire; stored events wait for the next start)
                        log.warning("stopping: database unavailable (%s)", short_error(exc))
                        continue
                    log.error("stopping: %s: %s", type(exc).__name__, exc, exc_info=exc)
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        if server is not None:
            server.close()
        if collector is not None:
            collector.close()
        notifier.close()
    if sup.fatal is not None:
        code = EXIT_FATAL
    elif aborted_by:
        code = 128 + aborted_by[0]
    else:
        code = 0
    return Served(worker, code, sup, server.port if server else None)
