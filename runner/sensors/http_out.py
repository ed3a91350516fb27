"""Webhooks out over kept-alive connections: one ``http.client`` connection per receiver
(scheme, host, port), reused from one request to the next.

A new connection per request (what ``urllib.request.urlopen`` does: it sends
``Connection: close``) cost a TCP set-up and tear-down per alert: with a delivery per
completion of a busy flow, about as much CPU as the flow's own attempts. A connection the
receiver closed meanwhile (it answered ``Connection: close``, or its idle timeout passed)
is seen before it is reused (readable, or no socket), and opened again; a request whose
reused connection turns out closed before any answer is sent once more on a new one (the
keep-alive race every HTTP client retries; each carries its ``Idempotency-Key``).

What ``http.client`` does not do goes through ``urllib.request`` as before: a URL the
environment's proxy variables (``https_proxy``, ...) route through a proxy, and a ``3xx``
answer's redirect (followed as ``urllib`` follows it, from the answer: the request is not
sent to the redirecting URL twice).
"""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import cast
from urllib.parse import urljoin, urlsplit

#: Failures of a request on a REUSED connection that mean the receiver had closed it
#: before reading the request: sent once more, on a new connection.
_CLOSED = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass
class Answer:
    """A receiver's answer: HTTP ``status`` and ``headers`` (``Retry-After`` is read)."""

    status: int
    headers: Message


class Receivers:
    """Kept-alive connections to the receivers of webhooks, by (scheme, host, port).

    Not thread-safe per receiver: the caller sends one receiver's requests from one
    thread at a time (``runner.sensors.deliver`` sends each receiver's serially).
    """

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._tls: ssl.SSLContext | None = None
        self._proxied: dict[tuple[str, str, int], bool] = {}

    def close(self) -> None:
        """Close every connection kept."""
        for conn in self._open.values():
            conn.close()
        self._open.clear()

    def send(
        self, url: str, method: str, body: bytes | None, headers: dict[str, str], timeout: float
    ) -> Answer:
        """Send one request and read its whole answer (``timeout``: seconds per socket
        operation). Raises ``OSError`` (connection refused, timed out, ...) or
        ``http.client.HTTPException`` when no answer came."""
        key = receiver(url)
        if key[0] not in ("http", "https"):
            raise ValueError(f"not an http(s) URL: {url}")
        proxied = self._proxied.get(key)
        if proxied is None:  # the environment is read once a receiver (~0.3 ms a look)
            proxied = self._proxied[key] = _proxied(key[0], key[1])
        if proxied:
            return _through_urllib(url, method, body, headers, timeout)
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._open.get(key)
        reused = conn is not None and _usable(conn)
        if conn is None or not reused:
            if conn is not None:
                conn.close()
            conn = self._open[key] = self._connection(*key, timeout)
        try:
            answer = _exchange(conn, method, target, body, headers, timeout)
        except _CLOSED:
            conn.close()
            if not reused:
                raise
            try:
                answer = _exchange(conn, method, target, body, headers, timeout)  # anew
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()  # whatever was half sent or half read is not reused
            raise
        if 300 <= answer.status < 400:
            return _redirected(url, method, body, headers, timeout, answer)
        return answer

    def _connection(
        self, scheme: str, host: str, port: int, timeout: float
    ) -> http.client.HTTPConnection:
        if scheme == "http":
            return _Plain(host, port, timeout=timeout)
        if self._tls is None:
            self._tls = ssl.create_default_context()  # what urllib verifies with
        return _Tls(host, port, timeout=timeout, context=self._tls)


class _Plain(http.client.HTTPConnection):
    """``http.client`` sends a request's headers and body in two writes: without
    ``TCP_NODELAY`` the body waits for the headers' ACK (delayed ACK, up to 40 ms)."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Tls(http.client.HTTPSConnection):
    """:class:`_Plain` over TLS."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def receiver(url: str) -> tuple[str, str, int]:
    """The receiver of ``url``: (scheme, host, port), the key of its kept connection
    (``("", url, 0)`` for a URL that names none)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is no number
        return "", url, 0
    if not parts.hostname:
        return "", url, 0
    return parts.scheme, parts.hostname, port


def _usable(conn: http.client.HTTPConnection) -> bool:
    """True when ``conn`` is open and the receiver has neither closed it nor sent
    anything unasked (both make its socket readable)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _exchange(
    conn: http.client.HTTPConnection,
    method: str,
    target: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
) -> Answer:
    """One request on ``conn`` (connected now if it is not) and its answer, read whole so
    the connection can carry the next one."""
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    conn.request(method, target, body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    return Answer(resp.status, resp.headers)


def _proxied(scheme: str, host: str) -> bool:
    """True when the environment routes requests to ``host`` by ``scheme`` through a proxy
    (as ``urllib`` would)."""
    proxies = urllib.request.getproxies()
    return scheme in proxies and not urllib.request.proxy_bypass(host)


def _redirected(
    url: str,
    method: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
    answer: Answer,
) -> Answer:
    """Follow the redirect ``answer`` (a 3xx to the request already sent to ``url``) as
    ``urllib`` follows one, without sending the request to ``url`` again: the next
    request is ``urllib``'s choice (a POST answered 301/302/303 becomes a GET without a
    body; a 307/308 to a POST is not followed), then ``urllib`` follows the rest."""
    location = answer.headers.get("Location") or answer.headers.get("URI")
    if not location:
        return answer
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        follow = urllib.request.HTTPRedirectHandler().redirect_request(
            request,
            io.BytesIO(),
            answer.status,
            "",
            cast(http.client.HTTPMessage, answer.headers),
            urljoin(url, location),
        )
    except urllib.error.HTTPError:  # urllib would not follow it: the answer stands
        return answer
    return answer if follow is None else _open(follow, timeout)


def _through_urllib(
    url: str, method: str, body: bytes | None, headers: dict[str, str], timeout: float
) -> Answer:
    """The request sent by ``urllib.request`` (proxies, redirects); an HTTP error status
    is an :class:`Answer` like any other."""
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    return _open(request, timeout)


def _open(request: urllib.request.Request, timeout: float) -> Answer:
    """``request`` sent by ``urllib.request``; an HTTP error status is an :class:`Answer`."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return Answer(resp.status, resp.headers)
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.headers)
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from exc
