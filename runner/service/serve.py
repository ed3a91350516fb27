"""``flowrun serve``: the operator console in a browser, through ``textual-serve``.

Each browser session runs ``flowrun tui`` (``--attach``/``--readonly`` as given) in its
own process, driven over a websocket by textual-serve's page. Loopback by default; any
other address needs a token (``--token`` or ``FLOWRUN_SERVE_TOKEN``): the page is opened
as ``/?token=T``, which sets an HttpOnly, SameSite=Strict cookie the websocket then
presents; a request with neither gets ``401``.
"""

from __future__ import annotations

import hmac
import ipaddress
import shlex
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from textual_serve.server import Server

from runner.errors import UserError

#: The cookie that carries the token from the page to its websocket.
COOKIE = "flowrun_token"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback ``host`` without a token: ``UserError(..., 2)``."""
    if not is_loopback(host) and not token:
        raise UserError(
            f"serve: binding {host} (not loopback) needs a token: --token T or FLOWRUN_SERVE_TOKEN",
            2,
        )


def console_command(
    flows: Path, db: str, lease: float, *, attach: bool, readonly: bool, pool: int = 2
) -> str:
    """The shell command textual-serve runs per browser session: this interpreter's
    ``flowrun tui`` with the same flows folder, database, lease (seconds) and PostgreSQL
    pool size (``--pool-size``: connections per console)."""
    argv = [sys.executable, "-m", "runner.cli", "--flows", str(Path(flows).absolute())]
    argv += ["--db", db, "--lease", f"{lease:g}", "--pool-size", str(pool), "tui"]
    if attach:
        argv.append("--attach")
    if readonly:
        argv.append("--readonly")
    return shlex.join(argv)


class ConsoleServer(Server):
    """textual-serve's ``Server`` with a token check and URLs taken from each request.

    Args:
        command: the console's shell command (:func:`console_command`).
        host, port: where to listen.
        token: the secret the page must present, or ``None`` (loopback only).
    """

    def __init__(self, command: str, host: str, port: int, token: str | None) -> None:
        super().__init__(command, host=host, port=port, title="flowrun")
        self.token = token

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._auth)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.token is None or request.path.startswith("/static/"):
            return await handler(request)
        given = request.query.get("token") or request.cookies.get(COOKIE) or ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            raise web.HTTPUnauthorized(
                text="flowrun serve: a token is required (open /?token=YOUR_TOKEN)\n"
            )
        response = await handler(request)
        if request.path == "/" and request.query.get("token"):
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
        return response

    async def handle_index(self, request: web.Request) -> Any:
        """The page, with its websocket and static URLs on the host the browser used."""
        self.public_url = f"{request.scheme}://{request.host}"
        return await super().handle_index(request)

    async def on_startup(self, app: web.Application) -> None:
        """One line on stderr instead of textual-serve's banner."""
        where = f"http://{self.host}:{self.port}/"
        hint = "?token=YOUR_TOKEN" if self.token else ""
        print(f"flowrun: serving the console on {where}{hint} (Ctrl+C stops)", file=sys.stderr)

    def initialize_logging(self) -> None:
        """Leave logging to flowrun (textual-serve would install a rich handler)."""


def serve(
    flows: Path,
    db: str,
    lease: float,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    attach: bool = False,
    readonly: bool = False,
    token: str | None = None,
    pool: int = 2,
) -> None:
    """Serve the console until SIGINT/SIGTERM. ``pool`` is each browser session's
    ``--pool-size`` (PostgreSQL connections per console).

    Raises:
        UserError: a non-loopback ``host`` without ``token`` (exit 2), or the address
            cannot be bound (exit 2).
    """
    check_binding(host, token)
    command = console_command(flows, db, lease, attach=attach, readonly=readonly, pool=pool)
    server = ConsoleServer(command, host, port, token)
    try:
        server.serve()
    except OSError as exc:
        raise UserError(
            f"serve: cannot listen on {host}:{port}: {exc.strerror or exc}", 2
        ) from None
