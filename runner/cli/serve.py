"""``flowrun serve``: the console in a browser (``runner.service.serve``)."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.context import Ctx, pass_ctx


def _duration(_ctx: click.Context, _param: click.Parameter, value: str) -> float | None:
    """``--idle-timeout``: a duration (``30m``, ``90s``, seconds) or ``0`` for never."""
    from runner.durations import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return seconds or None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True)
@click.option(
    "--attach/--embedded-worker",
    default=True,
    show_default=True,
    help="Sessions' consoles observe and command only (the default), or each runs a worker.",
)
@click.option("--readonly", is_flag=True, help="Refuse every command.")
@click.option(
    "--token",
    envvar="FLOWRUN_SERVE_TOKEN",
    help="Secret every session presents (/?token=T), at least 16 characters "
    "(default: one generated and printed in the URL).",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Most browser sessions (console processes) at once; more get 503.",
)
@click.option(
    "--idle-timeout",
    default="30m",
    show_default=True,
    callback=_duration,
    help="Close a session after this long without input from its browser (0: never).",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Another name the page may be reached by (a DNS name, a proxy's); repeatable.",
)
@click.option(
    "--certfile",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Serve HTTPS with this PEM certificate (chain).",
)
@click.option(
    "--keyfile",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The certificate's PEM private key (default: in --certfile).",
)
@pass_ctx
def serve(
    c: Ctx,
    host: str,
    port: int,
    attach: bool,
    readonly: bool,
    token: str | None,
    max_sessions: int,
    idle_timeout: float | None,
    allow_hosts: tuple[str, ...],
    certfile: Path | None,
    keyfile: Path | None,
):
    """Serve the console in a browser (textual-serve), one console per session.

    Every session presents a token, loopback included: open the URL printed at start
    (http://HOST:PORT/?token=T; the page keeps it in an HttpOnly, SameSite=Strict
    cookie). The websocket's Origin and Host must name this server, so other sites open
    in the browser cannot reach it. Off loopback give --certfile/--keyfile or put a TLS
    proxy in front. The database URL reaches the consoles through their environment.

    \f
    Raises:
        UserError: a token under 16 characters, TLS files that do not load, or a port
            in use (exit 2).
    """
    from runner.service.serve import serve as run

    run(
        c.flows,
        c.db,
        c.lease,
        host=host,
        port=port,
        embedded_worker=not attach,
        readonly=readonly,
        token=token,
        pool=c.pool,
        max_sessions=max_sessions,
        idle_timeout=idle_timeout,
        allow_hosts=allow_hosts,
        certfile=certfile,
        keyfile=keyfile,
        pooler=c.pooler,
        listen_db=c.listen_db,
    )


COMMANDS = (serve,)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
