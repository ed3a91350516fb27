"""``flowrun serve``: the operator console in a browser, through ``textual-serve``.

Each browser session runs ``flowrun tui`` (``--attach`` unless ``embedded_worker``;
``--readonly`` as given) in its own process, driven over a websocket by textual-serve's
page. Every request passes :class:`runner.service.serve_guard.Guard` (Host, Origin,
token); at most ``max_sessions`` consoles run at once, and a session the browser has
sent nothing on for ``idle_timeout`` seconds is closed, as is one whose console ended on
its own or whose browser sent a message textual-serve's page never sends (one line on
stderr each, no traceback). The database URL reaches each
console through its environment (``FLOWRUN_DB``), never its command line, which every
user of the machine can read.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import ssl
import sys
import time
from asyncio import FIRST_COMPLETED
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server

from runner.durations import format_duration
from runner.errors import UserError
from runner.literal import one_line
from runner.service.serve_guard import Guard, checked_token, is_loopback


def console_command(
    flows: Path, lease: float, *, attach: bool, readonly: bool, pool: int = 2
) -> str:
    """The shell command textual-serve runs per browser session: this interpreter's
    ``flowrun tui`` with the same flows folder, lease (seconds) and PostgreSQL pool size
    (``--pool-size``: connections per console). The database URL is not in it: each
    console reads ``FLOWRUN_DB`` from the environment :func:`serve` gives it."""
    argv = [sys.executable, "-m", "runner.cli", "--flows", str(Path(flows).absolute())]
    argv += ["--lease", f"{lease:g}", "--pool-size", str(pool), "tui"]
    if attach:
        argv.append("--attach")
    if readonly:
        argv.append("--readonly")
    return shlex.join(argv)


#: The terminal sizes a session may ask for, in cells (a larger one is cut to this).
MAX_COLUMNS, MAX_ROWS = 1000, 500


def _cells(value: Any, most: int) -> int | None:
    """A terminal dimension from a browser (an int, or digits in the URL's query) cut to
    ``1..most``; ``None`` when it is no whole number."""
    if isinstance(value, str):
        value = int(value) if value.isascii() and value.isdigit() else None
    if type(value) is not int:
        return None
    return max(1, min(value, most))


def envelope(text: str) -> list[Any] | None:
    """A browser's message as textual-serve's page sends it (``["stdin", TEXT]``,
    ``["resize", {"width": W, "height": H}]``, ``["ping", TEXT]``, ``["focus"]``,
    ``["blur"]``), the size cut to :data:`MAX_COLUMNS` x :data:`MAX_ROWS`; ``[KIND]`` for
    a kind it does not know (ignored, as textual-serve does); ``None`` for anything else
    (not JSON, not a list starting with a kind, a known kind with other arguments, text
    that is not UTF-8)."""
    try:
        message = json.loads(text)
    except ValueError:
        return None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        return None
    kind, args = message[0], message[1:]
    if kind in ("stdin", "ping"):
        if len(args) != 1 or not isinstance(args[0], str):
            return None
        try:
            args[0].encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800")
            return None
        return message
    if kind == "resize":
        if len(args) != 1 or not isinstance(args[0], dict):
            return None
        width = _cells(args[0].get("width"), MAX_COLUMNS)
        height = _cells(args[0].get("height"), MAX_ROWS)
        if width is None or height is None:
            return None
        return ["resize", {"width": width, "height": height}]
    return [kind]


class _Console(AppService):
    """textual-serve's console process of one session, telling when it has ended (on its
    own: a crash, a kill; or stopped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ended = asyncio.Event()

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            self.ended.set()


class OneLineFaults:
    """The serve loop's exception handler: a fault the loop meets outside any session (an
    ``accept()`` out of descriptors, which asyncio retries every second) is one line on
    stderr, not a traceback; the same line again only after :attr:`FOLD` seconds."""

    #: seconds within which a repeat of the same line is not printed again
    FOLD = 30.0

    def __init__(self) -> None:
        self._said: dict[str, float] = {}

    def __call__(self, _loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        line = str(context.get("message") or "fault")
        if exc is not None:
            line += f": {getattr(exc, 'strerror', None) or exc}"
        now = time.monotonic()
        if now - self._said.get(line, -self.FOLD) >= self.FOLD:
            self._said[line] = now
            print(f"flowrun: serve: {one_line(line)}", file=sys.stderr)


class ConsoleServer(Server):
    """textual-serve's ``Server`` behind a :class:`Guard`, with a bounded number of
    sessions, idle sessions closed, optional TLS and URLs taken from each request.

    Args:
        command: the console's shell command (:func:`console_command`).
        host, port: where to listen.
        guard: the Host, Origin and token checks.
        max_sessions: the most browser sessions (console processes) at once.
        idle_timeout: seconds without a message from the browser before a session is
            closed (``None``: never).
        ssl_context: serve HTTPS and WSS with it, or ``None`` for plain HTTP.
        generated: whether the token was generated (the start line prints it then).
    """

    def __init__(
        self,
        command: str,
        host: str,
        port: int,
        guard: Guard,
        *,
        max_sessions: int = 4,
        idle_timeout: float | None = 1800.0,
        ssl_context: ssl.SSLContext | None = None,
        generated: bool = False,
    ) -> None:
        super().__init__(command, host=host, port=port, title="flowrun")
        self.guard, self.max_sessions, self.idle_timeout = guard, max_sessions, idle_timeout
        self.ssl_context, self.generated = ssl_context, generated
        self.sessions = 0

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.guard.middleware)
        return app

    async def handle_index(self, request: web.Request) -> Any:
        """The page, with its websocket and static URLs on the host the browser used."""
        self.public_url = f"{request.scheme}://{request.host}"
        return await super().handle_index(request)

    async def handle_websocket(  # type: ignore[override]  # aiohttp takes any response
        self, request: web.Request
    ) -> web.StreamResponse:
        """One browser session: ``400`` for a request that is no websocket handshake or
        asks for no terminal size, ``503`` when ``max_sessions`` run already; else a
        console process driven over the websocket until the browser closes it, goes idle,
        sends a malformed message, or the console ends. A console that cannot be started
        (``OSError``: out of descriptors or processes) closes its session in one line."""
        websocket = web.WebSocketResponse(heartbeat=15)
        width = _cells(request.query.get("width", "80"), MAX_COLUMNS)
        height = _cells(request.query.get("height", "24"), MAX_ROWS)
        if not websocket.can_prepare(request).ok or width is None or height is None:
            raise web.HTTPBadRequest(text="flowrun serve: /ws takes a websocket handshake\n")
        if self.sessions >= self.max_sessions:
            raise web.HTTPServiceUnavailable(
                text=f"flowrun serve: {self.max_sessions} sessions are open already "
                "(--max-sessions); close one and reload\n"
            )
        self.sessions += 1
        try:
            await websocket.prepare(request)
            console = _Console(
                self.command,
                write_bytes=websocket.send_bytes,
                write_str=websocket.send_str,
                close=websocket.close,
                download_manager=self.download_manager,
                debug=self.debug,
            )
            try:
                await console.start(width, height)
            except OSError as exc:  # no process, no pipe: out of descriptors or processes
                why = f"could not start its console: {exc.strerror or exc}"
                print(f"flowrun: serve: closed a session that {why}", file=sys.stderr)
                await websocket.close(code=WSCloseCode.INTERNAL_ERROR, message=why.encode())
                return websocket
            try:
                await self._session(websocket, console)
            finally:
                await console.stop()
        finally:
            self.sessions -= 1
        return websocket

    async def _session(self, websocket: web.WebSocketResponse, console: _Console) -> None:
        """Pass the browser's messages to ``console`` until the websocket closes; close it
        after ``idle_timeout`` seconds without a message (the heartbeat's pongs are none),
        at a malformed message, or once the console has ended on its own, saying which."""
        ended = asyncio.create_task(console.ended.wait())
        try:
            while True:
                # a deadline of our own: receive(timeout=) starts over at each heartbeat pong
                receive = asyncio.ensure_future(websocket.receive())
                await asyncio.wait(
                    (receive, ended), timeout=self.idle_timeout, return_when=FIRST_COMPLETED
                )
                if not receive.done():
                    receive.cancel()
                    await asyncio.wait((receive,))
                    if websocket.closed:  # the console quit and closed it (its "exit")
                        return
                    if ended.done():
                        code, why = WSCloseCode.GOING_AWAY, "whose console ended"
                    else:
                        idle = format_duration(self.idle_timeout or 0)
                        code, why = WSCloseCode.GOING_AWAY, f"idle for {idle}"
                    break
                message = receive.result()
                if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    return
                if message.type != WSMsgType.TEXT:
                    continue
                sent = envelope(message.data)
                if sent is None:
                    code, why = WSCloseCode.UNSUPPORTED_DATA, "that sent a malformed message"
                    break
                await self._dispatch(sent, websocket, console)
        finally:
            ended.cancel()
        print(f"flowrun: serve: closed a session {why}", file=sys.stderr)
        await websocket.close(code=code, message=why.encode())

    @staticmethod
    async def _dispatch(
        message: list[Any], websocket: web.WebSocketResponse, console: _Console
    ) -> None:
        """Act on one checked message (:func:`envelope`) as textual-serve's page means it."""
        kind = message[0]
        if kind == "stdin":
            await console.send_bytes(message[1].encode("utf-8"))
        elif kind == "resize":
            await console.set_terminal_size(message[1]["width"], message[1]["height"])
        elif kind == "ping":
            await websocket.send_json(["pong", message[1]])
        elif kind == "blur":
            await console.blur()
        elif kind == "focus":
            await console.focus()

    def url(self) -> str:
        """The address to open, with the token when it was generated."""
        scheme = "https" if self.ssl_context else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        token = self.guard.token if self.generated else "YOUR_TOKEN"
        return f"{scheme}://{host}:{self.port}/?token={token}"

    async def on_startup(self, app: web.Application) -> None:
        """Report the loop's own faults in one line (:class:`OneLineFaults`); no banner
        here: textual-serve would print its own (:meth:`announce` prints ours once the
        address is bound)."""
        asyncio.get_running_loop().set_exception_handler(OneLineFaults())

    def announce(self, *_args: Any) -> None:
        """One line on stderr, the URL to open, once listening (and a warning for plain
        HTTP off loopback)."""
        print(f"flowrun: serving the console on {self.url()} (Ctrl+C stops)", file=sys.stderr)
        if self.ssl_context is None and not is_loopback(self.host):
            print(
                "flowrun: serve: plain HTTP off loopback: the token crosses the network "
                "readable; give --certfile/--keyfile or put a TLS proxy in front",
                file=sys.stderr,
            )

    def initialize_logging(self) -> None:
        """Leave logging to flowrun (textual-serve would install a rich handler)."""

    def serve(self, debug: bool = False) -> None:
        """Serve until SIGINT/SIGTERM (HTTPS when ``ssl_context`` is set).

        Raises:
            OSError: the address cannot be bound.
        """
        self.debug = debug
        web.run_app(
            self._make_app(),
            host=self.host,
            port=self.port,
            ssl_context=self.ssl_context,
            print=self.announce,
            access_log=None,
        )


def tls_context(certfile: Path | None, keyfile: Path | None) -> ssl.SSLContext | None:
    """The server's TLS context from a PEM certificate (chain) and its key (``keyfile``
    ``None``: the key is in ``certfile``), or ``None`` without ``certfile``.

    Raises:
        UserError: a key without a certificate, or files that do not load (exit 2).
    """
    if certfile is None:
        if keyfile is not None:
            raise UserError("serve: --keyfile needs --certfile", 2)
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except OSError as exc:  # ssl.SSLError included
        files = f"{certfile} / {keyfile}" if keyfile else str(certfile)
        why = exc.strerror if not isinstance(exc, ssl.SSLError) else None
        why = why or "not a PEM certificate (chain) and its matching private key"
        raise UserError(f"serve: cannot load {files}: {why}", 2) from None
    return context


def serve(
    flows: Path,
    db: str,
    lease: float,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    embedded_worker: bool = False,
    readonly: bool = False,
    token: str | None = None,
    pool: int = 2,
    max_sessions: int = 4,
    idle_timeout: float | None = 1800.0,
    allow_hosts: tuple[str, ...] = (),
    certfile: Path | None = None,
    keyfile: Path | None = None,
    pooler: str = "auto",
    listen_db: str | None = None,
) -> None:
    """Serve the console until SIGINT/SIGTERM.

    Args:
        flows, db, lease: the global options (folder, database URL, lease in seconds).
        host, port: where to listen.
        embedded_worker: each session's console runs a worker (``flowrun tui`` without
            ``--attach``).
        readonly: the consoles refuse every command.
        token: the secret (at least 16 characters); ``None``: one is generated and printed.
        pool: each console's ``--pool-size`` (PostgreSQL connections per console).
        max_sessions: the most browser sessions at once.
        idle_timeout: seconds without input before a session is closed (``None``: never).
        allow_hosts: further names the ``Host`` header may carry (a proxy's, a DNS name).
        certfile, keyfile: PEM files to serve HTTPS with.
        pooler, listen_db: ``--db-pooler`` and ``--listen-db``, passed to each console
            through its environment (``FLOWRUN_DB_POOLER``, ``FLOWRUN_LISTEN_DB``).

    Raises:
        UserError: a token shorter than 16 characters, TLS files that do not load, or
            an address that cannot be bound (exit 2).
    """
    token, generated = checked_token(token)
    context = tls_context(certfile, keyfile)
    attach = not embedded_worker
    command = console_command(flows, lease, attach=attach, readonly=readonly, pool=pool)
    guard = Guard(host, port, token, allow_hosts)
    server = ConsoleServer(
        command,
        host,
        port,
        guard,
        max_sessions=max_sessions,
        idle_timeout=idle_timeout,
        ssl_context=context,
        generated=generated,
    )
    # what textual-serve's AppService copies into each console process's environment:
    # the URL (password included) stays out of every `ps`; the token is of no use there
    os.environ["FLOWRUN_DB"] = db
    os.environ["FLOWRUN_DB_POOLER"] = pooler
    if listen_db:
        os.environ["FLOWRUN_LISTEN_DB"] = listen_db
    os.environ.pop("FLOWRUN_SERVE_TOKEN", None)
    try:
        server.serve()
    except OSError as exc:
        raise UserError(
            f"serve: cannot listen on {host}:{port}: {exc.strerror or exc}", 2
        ) from None
