"""The daemon's one HTTP listener (``--metrics``, ``--http``): what it serves (the
Prometheus metrics, the webhook sensors' door) and where, bound and serving before the
worker's first claim (``service.daemon.Daemon`` makes it)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from runner.errors import ConfigError
from runner.service.options import ServiceOptions

if TYPE_CHECKING:
    from runner.engine.worker import Worker
    from runner.flowspec.registry import FlowRegistry
    from runner.service.http_listener import HttpListener
    from runner.service.metrics import AttemptTally, DaemonCollector
    from runner.service.supervisor import Supervisor

log = logging.getLogger("flowrun.daemon")


def shown(address: tuple[str, int]) -> str:
    """``host:port`` of an ``(host, port)`` address, as the options take it."""
    return f"{address[0]}:{address[1]}"


def open_http(
    engine: Engine,
    opts: ServiceOptions,
    worker: Worker,
    supervisor: Supervisor,
    tally: AttemptTally | None,
    hooks: FlowRegistry | None,
    kick_hub: Callable[[], None],
) -> tuple[HttpListener, DaemonCollector | None]:
    """The HTTP listener at ``opts.http`` (or ``opts.metrics``), bound and serving, and
    the metrics' collector when ``opts.metrics`` asks for them (``tally``: the worker's
    attempt counts). ``hooks``: the flows whose webhook sensors it serves (``None``: no
    sensors here), each request stored then ``kick_hub`` called (on the running loop).

    Raises:
        ConfigError: the address cannot be bound, ``--metrics`` and ``--http`` name two
            addresses, or an unauthenticated webhook sensor would be served beyond
            loopback.
    """
    from runner.service.http_listener import HttpListener
    from runner.service.webhooks import webhook_door

    address = opts.http or opts.metrics
    assert address is not None
    if opts.http and opts.metrics and opts.http != opts.metrics:
        raise ConfigError(
            f"--metrics {shown(opts.metrics)} and --http {shown(opts.http)}: the daemon "
            "has one HTTP listener; give both the same address, or only one of them"
        )
    app, collector = None, None
    if opts.metrics is not None and tally is not None:
        from runner.service.metrics import metrics_app

        collector, app = metrics_app(engine, worker, tally, supervisor)
    door = None
    if hooks is not None:
        door = webhook_door(engine, hooks, address, asyncio.get_running_loop(), kick_hub)
    http = HttpListener(*address, metrics=app, door=door)
    option = "--http" if opts.http else "--metrics"
    try:
        http.start()
    except OSError as exc:
        if collector is not None:
            collector.close()
        raise ConfigError(f"{option} {shown(address)}: {exc}") from None
    if app is not None:
        log.info("metrics on http://%s:%d/metrics", http.host, http.port)
    if door is not None:
        log.info("http listener on http://%s:%d (webhook sensors)", http.host, http.port)
    return http, collector
