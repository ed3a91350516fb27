"""``flowrun serve``: the console in a browser (``runner.service.serve``)."""

from __future__ import annotations

import click

from runner.cli.context import Ctx, pass_ctx


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8765, show_default=True)
@click.option("--attach", is_flag=True, help="Observe and command only; run no worker.")
@click.option("--readonly", is_flag=True, help="Refuse every command.")
@click.option(
    "--token",
    envvar="FLOWRUN_SERVE_TOKEN",
    help="Secret the page must present (/?token=T); required off loopback.",
)
@pass_ctx
def serve(c: Ctx, host: str, port: int, attach: bool, readonly: bool, token: str | None):
    """Serve the console in a browser (textual-serve), one console per session.

    Loopback by default; any other --host needs a token (--token or FLOWRUN_SERVE_TOKEN),
    refused (exit 2) without. Open http://HOST:PORT/?token=T. Without --attach each
    browser session's console runs an embedded worker, as `flowrun tui` does.

    \f
    Raises:
        UserError: a non-loopback host without a token, or a port in use (exit 2).
    """
    from runner.service.serve import serve as run

    run(
        c.flows,
        c.db,
        c.lease,
        host=host,
        port=port,
        attach=attach,
        readonly=readonly,
        token=token,
        pool=c.pool,
    )


COMMANDS = (serve,)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
