"""``flowrun --daemon``: the worker, the sensors and rules, and flow reload, in one process.

Signals follow huey's consumer and Stator's ``runstator``: the handlers only set flags.
SIGINT or SIGTERM once → graceful stop (no new claims, running attempts get ``grace``
seconds, locks released, exit 0); a second SIGINT → abort at once (handler process groups
are killed; the leases expire and any worker recovers the instances as ``lost``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys
import time
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.engine.worker import Worker, WorkerConfig
from runner.errors import FlowErrors
from runner.flowspec.registry import FlowRegistry
from runner.store import versions
from runner.store.create import record_version
from runner.store.db import short_error

log = logging.getLogger("flowrun.daemon")


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``msg``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """Log to stderr as ``text`` (human) or ``json`` (one object per line)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger("flowrun")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def load_registry(engine: Engine, flows_dir: Path) -> FlowRegistry:
    """Load every flow in ``flows_dir`` and store their versions.

    Raises ``FlowErrors`` when any flow file has errors (the daemon refuses to start on a
    broken folder; a later bad edit is reported and the good version kept).
    """
    registry = FlowRegistry(flows_dir)
    errors = registry.load_all()
    if errors:
        raise FlowErrors(errors)
    remember_all(engine, registry)
    return registry


def remember_all(engine: Engine, registry: FlowRegistry) -> None:
    """Record every loaded flow version in the database and the in-process cache."""
    with engine.begin() as conn:
        for flow in registry.flows.values():
            record_version(conn, flow)
            versions.remember(flow)


def _report_hub_end(task: asyncio.Task) -> None:
    """Say at once if the sensors stopped on an error (the worker carries on without them)."""
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        if isinstance(exc, DBAPIError):  # an outage is not a bug: one line (their leases
            # expire; the stored events wait for the next start)
            log.warning("sensors and rules stopped: database unavailable (%s)", short_error(exc))
            return
        log.error("sensors and rules stopped: %s: %s", type(exc).__name__, exc, exc_info=exc)


async def serve(
    engine: Engine,
    registry: FlowRegistry | None,
    config: WorkerConfig,
    *,
    install_signals: bool = True,
    sensors: bool = True,
    worker_ready: asyncio.Future | None = None,
) -> Worker:
    """Run a worker (and, with ``sensors``, the sensor hub) until stopped or idle.

    Returns the worker (its ``stats`` say what it did). ``worker_ready``, if given, gets
    the worker as its result once it exists (the console uses it to stop the worker).
    """
    hub = None
    if sensors and registry is not None:
        from runner.sensors.hub import SensorHub

        hub = SensorHub(engine, registry, config.worker_id, config.lease)

    def busy() -> bool:
        if hub is None:
            return False
        return not hub.ready.is_set() or hub.pending()

    worker = Worker(engine, config, idle_hint=busy)
    if hub is not None:
        hub.on_work = worker.wake
    if worker_ready is not None:
        worker_ready.set_result(worker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(name: str) -> None:
        mode = worker.request_stop()
        stop.set()
        if mode == "graceful":
            log.warning(
                "%s: stopping gracefully (up to %gs for running attempts); again to abort",
                name,
                config.grace,
            )
        else:
            log.warning("%s again: aborting now; open attempts will be recovered as lost", name)

    if install_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)
    # Everything loaded so far (SQLAlchemy, pydantic, the compiled flows: hundreds of
    # thousands of objects) lives as long as the process: move it out of the collector's
    # sight, so the collections the hot loop's short-lived objects trigger stay cheap
    # (measured: 12 of 16 us of the cost of starting an attempt was the collector).
    gc.freeze()
    hub_task = asyncio.ensure_future(hub.run(stop)) if hub is not None else None
    if hub_task is not None:
        hub_task.add_done_callback(_report_hub_end)
    try:
        await worker.run()
    finally:
        stop.set()
        if hub_task is not None:
            try:
                await asyncio.wait_for(hub_task, 10)
            except (TimeoutError, asyncio.CancelledError):
                hub_task.cancel()
            except DBAPIError:  # an outage, logged by _report_hub_end: the stop is clean
                pass
        if install_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    return worker
