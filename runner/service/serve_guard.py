"""Who may talk to ``flowrun serve``: the checks every request passes before textual-serve
sees it (an aiohttp middleware, :class:`Guard`).

- **Host**: the ``Host`` header must name the served address (a loopback name on a
  loopback bind, an IP address or the machine's name on another bind) or a name given
  with ``--allow-host``: a page that re-binds its own DNS name to this address (DNS
  rebinding) is refused.
- **Origin**: a request that carries ``Origin`` (every browser websocket does) must come
  from the page's own origin, the scheme, host and port of its ``Host``: a page of any
  other site open in the operator's browser cannot open the console's websocket.
- **Token**: always, loopback included; given once as ``/?token=T``, then kept in an
  ``HttpOnly; SameSite=Strict`` cookie named for the port.

A refused request gets ``403`` (Host, Origin) or ``401`` (token) with one line of text,
never a traceback.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
import sys
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from yarl import URL

from runner.errors import UserError

#: The fewest characters a ``--token`` may have (a generated one has 32).
MIN_TOKEN = 16

#: Addresses that mean "every interface".
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` (and ``*.localhost``) and loopback addresses (127.0.0.0/8,
    ``::1``)."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def checked_token(token: str | None) -> tuple[str, bool]:
    """The token to serve with and whether it was generated: ``token`` when given, else a
    new random one (32 URL-safe characters).

    Raises:
        UserError: a given token shorter than :data:`MIN_TOKEN` characters (exit 2).
    """
    if token is None or token == "":
        return secrets.token_urlsafe(24), True
    if len(token) < MIN_TOKEN:
        raise UserError(
            f"serve: the token (--token or FLOWRUN_SERVE_TOKEN) has {len(token)} characters; "
            f"give at least {MIN_TOKEN}, or none to have one generated",
            2,
        )
    return token, False


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names (lower case, IPv6 without brackets) the ``Host`` header may carry
    for a server bound to ``host``, besides IP addresses on a non-loopback bind: the
    bound name, the loopback names on a loopback bind, the machine's names on a wildcard
    bind (``0.0.0.0``, ``::``), and ``extra`` (``--allow-host``)."""
    names = {host.strip("[]").lower(), *(e.strip("[]").lower() for e in extra)}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "::1"}
    elif host in WILDCARDS:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names - {""})


def _host_name(host_header: str) -> str | None:
    """The host name of a ``Host`` header (``None`` when empty or malformed)."""
    try:
        url = URL(f"http://{host_header}")
    except ValueError:
        return None
    if not host_header or url.raw_path not in ("", "/") or url.query_string or url.user:
        return None
    return url.host or None


def _literal(text: str) -> str:
    """Outside text for the log: quoted, control characters escaped."""
    return ascii(text[:200])


class Guard:
    """The Host, Origin and token checks of ``flowrun serve``.

    Args:
        host: the address the server is bound to (``--host``).
        port: its port (names the cookie, so two servers on one host keep theirs apart).
        token: the secret every request presents (``/?token=T`` or the cookie).
        allow_hosts: further names the ``Host`` header may carry (``--allow-host``).
    """

    def __init__(self, host: str, port: int, token: str, allow_hosts: Iterable[str] = ()):
        self.token = token
        self.cookie = f"flowrun_token_{port}"
        self.names = allowed_hosts(host, allow_hosts)
        self.any_ip = not is_loopback(host)

    def host_allowed(self, name: str) -> bool:
        """Whether a ``Host`` header's host name (no port) may reach this server."""
        name = name.strip("[]").lower()
        if name in self.names:
            return True
        if _is_ip(name):
            return self.any_ip or is_loopback(name)
        return False

    @staticmethod
    def same_origin(origin: str, host_header: str) -> bool:
        """Whether ``Origin`` names the scheme, host and port that ``Host`` names (a
        ``Host`` without a port means the default port of the origin's scheme)."""
        try:
            o = URL(origin)
            h = URL(f"{o.scheme}://{host_header}")
        except ValueError:
            return False
        if o.scheme not in ("http", "https") or not o.host or o.path not in ("", "/"):
            return False
        return (o.host.lower(), o.port) == ((h.host or "").lower(), h.port)

    def _refuse(self, request: web.Request, what: str) -> web.HTTPForbidden:
        print(
            f"flowrun: serve: refused {request.method} {_literal(request.path)}: {what}",
            file=sys.stderr,
        )
        return web.HTTPForbidden(text=f"flowrun serve: {what}\n")

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Check Host, then Origin, then the token; set the cookie on ``/?token=T``.

        Raises:
            web.HTTPForbidden: a foreign ``Host`` or ``Origin`` (403).
            web.HTTPUnauthorized: no token or a wrong one (401).
        """
        host_header = request.headers.get("Host", "")
        name = _host_name(host_header)
        if name is None or not self.host_allowed(name):
            raise self._refuse(
                request,
                f"Host {_literal(host_header)} is not this server's name "
                "(--allow-host NAME admits another)",
            )
        origin = request.headers.get("Origin")
        if origin is not None and not self.same_origin(origin, host_header):
            raise self._refuse(request, f"Origin {_literal(origin)} is not this server's page")
        if not request.path.startswith("/static/"):
            given = request.query.get("token") or request.cookies.get(self.cookie) or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise web.HTTPUnauthorized(
                    text="flowrun serve: a token is required (open the URL it printed, "
                    "/?token=YOUR_TOKEN)\n"
                )
        response = await handler(request)
        if request.path == "/" and request.query.get("token"):
            response.set_cookie(
                self.cookie,
                self.token,
                httponly=True,
                samesite="Strict",
                secure=request.secure,
            )
        return response
