"""``flowrun`` / ``flowrun tui``: the console, with an embedded worker unless ``--attach``.

This is the one place that puts a worker next to the console. The console itself
(``runner.tui``) never imports the worker: it reads the store and writes command rows, so
it steers this embedded worker, a local daemon, or daemons on other hosts alike. The
embedded worker runs the same ``serve`` as ``--daemon`` in a thread with its own event
loop. The log (the embedded worker's, and the details of a console view that failed,
``runner.tui.guard``) goes to ``.flowrun/console.log`` so it cannot scribble over the
screen.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.handlers.capture import RedactRecords

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from runner.engine.config import WorkerConfig
    from runner.engine.worker import Worker
    from runner.flowspec.registry import FlowRegistry


def _log_to_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactRecords())
    root = logging.getLogger("flowrun")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


class EmbeddedWorker:
    """``serve`` (worker + sensors) in a background thread; ``stop()`` stops it gracefully."""

    def __init__(
        self,
        engine: Engine,
        registry: FlowRegistry,
        config: WorkerConfig,
        listen_url: str | None = None,
    ):
        self.engine, self.registry, self.config = engine, registry, config
        self.listen_url = listen_url  # ``--listen-db`` (PostgreSQL)
        self.worker: Worker | None = None
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="flowrun-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def _main(self) -> None:
        from runner.service.daemon import serve
        from runner.service.options import ServiceOptions

        async def go() -> None:
            self.loop = asyncio.get_running_loop()
            fut: asyncio.Future[Worker] = asyncio.get_running_loop().create_future()

            def ready(f: asyncio.Future[Worker]) -> None:
                self.worker = f.result()
                self._ready.set()

            fut.add_done_callback(ready)
            await serve(
                self.engine,
                self.registry,
                self.config,
                install_signals=False,
                worker_ready=fut,
                options=ServiceOptions(listen_url=self.listen_url),
            )

        try:
            asyncio.run(go())
        except BaseException as exc:  # noqa: BLE001 - reported after the console closes
            self.error = exc
            self._ready.set()

    def alive(self) -> bool:
        """True while the worker thread runs."""
        return self._thread.is_alive()

    def request_stop(self) -> None:
        """Ask the worker to stop, on its own loop (first call graceful, then abort); a
        worker that already ended is left alone."""
        if self.worker is None or self.loop is None or not self.alive():
            return
        try:
            self.loop.call_soon_threadsafe(self.worker.request_stop)
        except RuntimeError:  # its loop closed meanwhile: it has stopped
            pass

    def stop(self, timeout: float) -> None:
        """Stop gracefully (unless already stopped) and wait up to ``timeout`` seconds."""
        if not self.worker or not self.worker.stopping:
            self.request_stop()
        self._thread.join(timeout)


class ConsoleStopper:
    """What the console's ``q`` needs of the embedded worker (``runner.tui`` never
    imports the worker): ``running()`` attempts, ``grace`` seconds, ``stop()`` (first
    graceful, then abort) and ``stopped()``."""

    def __init__(self, embedded: EmbeddedWorker, grace: float) -> None:
        self.embedded = embedded
        self.grace = grace

    def running(self) -> int:
        """Attempts the embedded worker runs now."""
        worker = self.embedded.worker
        return len(worker.running) if worker is not None else 0

    def stop(self) -> None:
        """Ask the worker to stop (graceful the first time, abort the second)."""
        self.embedded.request_stop()

    def stopped(self) -> bool:
        """True once the worker thread has ended."""
        return not self.embedded.alive()


def run_console(c: Any, *, attach: bool, readonly: bool, config: Any = None) -> None:
    """Open the console for the CLI context ``c`` (``runner.cli.context.Ctx``); unless
    ``attach``, with an embedded worker run with ``config`` (a
    ``runner.engine.config.WorkerConfig``, required then)."""
    from runner.tui.app import FlowrunApp

    engine = c.engine
    flows_dir = c.flows if c.flows.is_dir() else None
    embedded = None
    if not attach:
        from runner.service.startup import load_registry

        if flows_dir is None:
            from runner.errors import ConfigError

            raise ConfigError(f"{c.flows}: flows folder not found (use --attach to only observe)")
        registry = load_registry(engine, flows_dir)
    # the worker's log and the details of a view that failed (runner.tui.guard); an
    # observer (--attach) in a folder it cannot write to goes on without the details
    try:
        _log_to_file(Path(".flowrun") / "console.log")
    except OSError:
        if not attach:
            raise
    if not attach:
        embedded = EmbeddedWorker(engine, registry, config, c.listen_db)
        embedded.start()
    stopper = ConsoleStopper(embedded, c.worker_options.grace) if embedded else None
    app = FlowrunApp(
        engine, flows_dir=flows_dir, readonly=readonly, clock=time.time, stopper=stopper
    )
    try:
        app.run()
    finally:
        if embedded is not None:
            embedded.stop(timeout=c.worker_options.grace + 5)
    if embedded is not None and embedded.error is not None:
        raise embedded.error
