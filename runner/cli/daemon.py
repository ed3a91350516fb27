"""``flowrun --daemon``: the headless daemon's entry from the command line (options to
``runner.service.daemon.serve``), and how its faults become exit codes and log lines."""

from __future__ import annotations

import logging

from runner.cli.context import Ctx, worker_config
from runner.errors import ConfigError, FlowErrors, UserError


def run_daemon(c: Ctx) -> int:
    """Run the headless daemon (worker + sensors + rules + reload) until stopped; returns
    the exit code: 0 clean stop or idle exit, 2 bad flows or configuration (logged, so a
    JSON log stays JSON), 70 a part could not be kept alive, 130/143 aborted by a second
    SIGINT/SIGTERM.
    """
    import gc

    # Start-up makes hundreds of thousands of long-lived objects and next to no cyclic
    # garbage: the collector's passes over them were a tenth of the time to the first
    # claim. ``serve`` freezes what start-up made and turns the collector back on.
    gc.disable()
    try:
        return _run_daemon(c)
    finally:
        gc.enable()


def _address(option: str, text: str | None) -> tuple[str, int] | None:
    """``--metrics``/``--http``'s ``[HOST:]PORT`` as ``(host, port)`` (``None``: not given).

    Raises:
        ConfigError: not a port 0-65535 (one line naming the option)."""
    if not text:
        return None
    from runner.service.http_listener import parse_address

    try:
        return parse_address(text)
    except ValueError as exc:
        raise ConfigError(f"{option} {text}: {exc}") from None


def _run_daemon(c: Ctx) -> int:
    import asyncio

    from runner.service.daemon import serve
    from runner.service.logs import setup_logging
    from runner.service.options import ServiceOptions
    from runner.service.startup import load_registry

    so, wo, kept = c.daemon_options, c.worker_options, c.retention
    config = worker_config(c)
    c.application_name = f"flowrun {config.worker_id}"  # its connections in pg_stat_activity
    setup_logging(wo.log_format, so.log_level, so.log_attempts)
    log = logging.getLogger("flowrun.daemon")
    try:
        address = _address("--metrics", so.metrics)
        http = _address("--http", so.http)
        if not c.flows.is_dir():
            raise ConfigError(
                f"{c.flows}: flows folder not found (set --flows or FLOWRUN_FLOWS; "
                "`flowrun init` creates one)"
            )
        registry = load_registry(c.engine, c.flows)
        log.info("loaded %d flows from %s", len(registry.flows), c.flows)
        if not registry.flows and not registry.errors:
            log.warning(
                "no flows in %s: `flowrun init` writes an example; a flow file added there is "
                "loaded while running",
                c.flows,
            )
        options = ServiceOptions(
            metrics=address,
            http=http,
            progress=wo.exit_when_idle,
            log_attempts=so.log_attempts,
            prune_every=kept.prune_every,
            retention=kept.retention,
            event_retention=kept.event_retention,
            log_store_max=kept.log_store_max,
            listen_url=c.listen_db,
        )
        served = asyncio.run(serve(c.engine, registry, config, options=options))
    except FlowErrors as exc:
        if wo.log_format != "json":
            raise  # one plain line each: file:line:col: message
        for e in exc.errors:
            log.error("%s", e, extra={"file": e.file, "line": e.line, "col": e.col})
        return 2
    except (ConfigError, UserError) as exc:
        if wo.log_format != "json":
            raise
        log.error("flowrun: %s", exc)
        return exc.exit_code
    from runner.service.progress import closing_line

    log.info("%s", closing_line(served.worker.stats))
    return served.code
