"""What a daemon (and the console's embedded worker) does before its loop: load the flows
folder (``load_registry``), choose the URL it ``LISTEN``s on (``listen_url``), and import
the sensor hub's modules off the loop (``preload_hub``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine

from runner.engine.config import WorkerConfig
from runner.errors import ConfigError, FlowErrors
from runner.flowspec.registry import FlowRegistry
from runner.flowspec.setup_checks import privilege_errors, setup_warnings
from runner.store import versions
from runner.store.create import record_version
from runner.store.db import redact
from runner.store.dialect import dialect_of
from runner.store.notify import listen_db_url
from runner.store.pooler import pooler_of

log = logging.getLogger("flowrun.daemon")


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

    declare_flows(engine, registry)  # before the hub starts
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


def listen_url(engine: Engine, given: str | None, config: WorkerConfig) -> str | None:
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
