"""The daemon's one HTTP listener: Prometheus ``/metrics`` (``--metrics``) and the webhook
sensors' paths (``--http``), on the same port.

The stdlib's ``wsgiref`` server (what prometheus_client's own server is made of), one
thread per request, in a thread of its own; the supervisor watches it
(:meth:`HttpListener.watch`). A webhook's body is read only when its ``Content-Length``
is at most ``runner.sensors.webhook.BODY_MAX`` and the request passed the checks made
before (path, method, token); otherwise it is answered at once (``413``, ``401``, ...)
and the body is then read and discarded, never kept (a bounded "lingering close",
:data:`DRAIN_MAX`, so the client reads the answer instead of a reset connection).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sqlalchemy.exc import SQLAlchemyError

from runner.sensors.webhook import BODY_MAX, Reply

if TYPE_CHECKING:
    from runner.sensors.webhook import WebhookDoor

log = logging.getLogger("flowrun.http")

#: A WSGI application (PEP 3333).
App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: Most bytes of an over-long body discarded after its 413 before the connection closes.
DRAIN_MAX = 16 << 20
#: Seconds a request's socket may stay silent before its thread gives up on it.
SOCKET_TIMEOUT = 30.0

_REASONS = {
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    503: "Service Unavailable",
}


def parse_address(text: str) -> tuple[str, int]:
    """``"[HOST:]PORT"`` → ``(host, port)``; only a port means loopback ``127.0.0.1``.

    Raises ``ValueError`` for a port that is not 0-65535."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} out of range")
    return host, number


def loopback(host: str) -> bool:
    """True when ``host`` (an address or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: may resolve beyond loopback


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Quiet(WSGIRequestHandler):
    """No access log on stderr (debug lines instead); a silent client times out."""

    timeout = SOCKET_TIMEOUT

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("%s " + format, self.client_address[0], *args)


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    """The request's headers, lower-case names (``x-github-event``)."""
    out = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            out[key[5:].replace("_", "-").lower()] = value
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            out[key.replace("_", "-").lower()] = environ[key]
    return out


class _Drained:
    """A response body whose ``close`` (called by the server once the response is
    written) discards up to ``left`` bytes of the request body, unstored."""

    def __init__(self, data: bytes, stream: Any, left: int) -> None:
        self.data, self.stream, self.left = data, stream, min(left, DRAIN_MAX)

    def __iter__(self) -> Iterator[bytes]:
        yield self.data

    def close(self) -> None:
        try:
            while self.left > 0:
                chunk = self.stream.read(min(self.left, 1 << 16))
                if not chunk:
                    break
                self.left -= len(chunk)
        except OSError:
            pass


class HttpListener:
    """The listener at ``host:port``: ``/metrics`` through ``metrics`` (a WSGI app, or
    ``None``), every other path through ``door`` (a ``WebhookDoor``, or ``None``: 404).

    ``start()`` binds (raises ``OSError`` when it cannot); ``port`` is then the bound one
    (port 0 picks a free one)."""

    def __init__(
        self, host: str, port: int, *, metrics: App | None = None, door: WebhookDoor | None = None
    ) -> None:
        self.host, self.port, self.metrics, self.door = host, port, metrics, door
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread."""
        server = make_server(self.host, self.port, self.app, _Server, _Quiet)
        self._server, self.port = server, server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, name="flowrun-http")
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    async def watch(self, stop: asyncio.Event) -> None:
        """Keep serving until ``stop``; raise if the thread died (the supervisor starts
        it again). Each second the door's routes are brought up to date with the loaded
        flows, so a reloaded flow's unset secret is warned about when it loads."""
        if self._server is None:
            self.start()
        try:
            while not stop.is_set():
                if self.door is not None:
                    self.door.routes()
                if self._thread is not None and not self._thread.is_alive():
                    self._server = None
                    raise RuntimeError("http listener thread ended")
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except TimeoutError:
                    pass
        finally:
            if stop.is_set():
                self.close()

    # -- WSGI -----------------------------------------------------------------------

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """The WSGI application: ``/metrics`` or a webhook."""
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics" and self.metrics is not None:
            return self.metrics(environ, start_response)
        if self.door is None:
            return _reply(start_response, Reply(404, {"error": "not found"}))
        return self._webhook(environ, start_response, path)

    def _webhook(
        self, environ: dict[str, Any], start_response: Callable[..., Any], path: str
    ) -> Iterable[bytes]:
        assert self.door is not None
        headers = _headers(environ)
        stream = environ["wsgi.input"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or "")
        except ValueError:
            length = -1
        opened = self.door.open(environ.get("REQUEST_METHOD", "GET"), path, headers)
        if isinstance(opened, Reply):  # the body, unread, is discarded after the answer
            return _reply(start_response, opened, drain=(stream, max(0, length)))
        if length < 0:
            return _reply(start_response, Reply(411, {"error": "Content-Length required"}))
        if length > BODY_MAX:
            reply = Reply(413, {"error": f"body over {BODY_MAX} bytes"})
            return _reply(start_response, reply, drain=(stream, max(0, length)))
        body = stream.read(length) if length else b""
        try:
            reply = self.door.accept(opened, headers, body)
        except SQLAlchemyError as exc:  # nothing was stored: the sender may retry
            log.warning("webhook %s: event not stored: %s", opened.sensor, type(exc).__name__)
            reply = Reply(503, {"error": "the event could not be stored; retry"})
        return _reply(start_response, reply)


def _reply(
    start_response: Callable[..., Any], reply: Reply, drain: tuple[Any, int] | None = None
) -> Iterable[bytes]:
    data = json.dumps(reply.doc).encode() + b"\n"
    head = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    start_response(f"{reply.status} {_REASONS.get(reply.status, '')}".rstrip(), head)
    if drain is not None:
        return _Drained(data, *drain)
    return [data]
