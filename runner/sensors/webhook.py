"""The ``webhook`` sensor: JSON POSTed by other systems, stored as events before the answer.

The requests arrive on the daemon's HTTP listener (``runner.service.http_listener``), in
its threads; this module decides what each one gets (:class:`WebhookDoor`): ``404`` for a
path no loaded webhook sensor serves, ``405`` for another method than ``POST``, ``401``
for a missing or wrong bearer token or signature (nothing stored), ``413`` for a body
over :data:`BODY_MAX`, ``400`` for a body that is not JSON, else the event is stored
(``runner.sensors.events.store_event``: committed) and only then ``202`` with its id.
Every daemon with a listener serves every webhook sensor: there is no lease, a request
is stored once whichever daemon answers it.

Secrets (the token, the HMAC key) are read from the daemon's environment at each request
and compared in constant time; they are never stored or logged. The stored event is
``{"body": <the parsed JSON>, "headers": {lower-cased name: value}}`` without the
``Authorization`` header and the signature header.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from runner.sensors.base import Sensor, log
from runner.sensors.events import store_event

if TYPE_CHECKING:
    from runner.flowspec.registry import FlowRegistry
    from runner.flowspec.spec_sensors import WebhookInSpec

#: Largest body accepted, bytes (1 MiB); a longer one is answered 413 unread.
BODY_MAX = 1 << 20


class WebhookSensor(Sensor):
    """Holds nothing and watches nothing: the daemon's listener stores its events. Run
    under a lease like every sensor only so ``sensors`` lists it."""

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        await stop.wait()


@dataclass(frozen=True)
class Reply:
    """What a request gets: an HTTP ``status`` (int) and a JSON ``doc``."""

    status: int
    doc: dict[str, Any]


@dataclass(frozen=True)
class Route:
    """A webhook sensor serving a path: its ``sensor`` name (``"<flow>.<sensor>"``), its
    ``spec`` (``WebhookInSpec``) and its flow file (for messages)."""

    sensor: str
    spec: WebhookInSpec
    file: str


def webhook_routes(registry: FlowRegistry) -> dict[str, Route]:
    """Path -> :class:`Route` of every webhook sensor of the loaded flows (a path served
    twice keeps the first flow by file path; ``flowrun check`` refuses that anyway)."""
    out: dict[str, Route] = {}
    for flow in sorted(list(registry.flows.values()), key=lambda f: str(f.path)):
        for name, spec in sorted((flow.sensors or {}).items()):
            hook = getattr(spec, "webhook", None)
            if hook is not None:
                out.setdefault(hook.path, Route(f"{flow.name}.{name}", hook, str(flow.path)))
    return out


def unauthenticated(registry: FlowRegistry) -> list[Route]:
    """The webhook sensors of the loaded flows with ``unauthenticated: true``."""
    return [r for r in webhook_routes(registry).values() if r.spec.unauthenticated]


def _refuse(name: str) -> Any:
    """``NaN``/``Infinity`` are not JSON (PostgreSQL's ``jsonb`` refuses them)."""
    raise ValueError(f"{name} is not JSON")


def _error(status: int, message: str) -> Reply:
    return Reply(status, {"error": message})


class WebhookDoor:
    """Answers webhook requests for the flows of ``registry`` (read at each request, so a
    reloaded flow serves its new paths at once).

    Args:
        engine: the database the events go to.
        registry: the daemon's ``FlowRegistry``.
        exposed: the listener is bound beyond loopback: an ``unauthenticated`` sensor is
            answered ``403`` (one loaded later than the start-up's refusal).
        on_event: called (in the listener's thread) after an event was stored, to wake
            the rules.
        environ: where secrets are read (default ``os.environ``, at each request).
    """

    def __init__(
        self,
        engine: Engine,
        registry: FlowRegistry,
        *,
        exposed: bool = False,
        on_event: Callable[[], None] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.engine, self.registry, self.exposed = engine, registry, exposed
        self.on_event = on_event
        self.environ = os.environ if environ is None else environ
        self._warned: set[tuple[str, str]] = set()
        self._routes: tuple[tuple[tuple[str, str], ...], dict[str, Route]] = ((), {})
        self._lock = threading.Lock()
        self.routes()  # an unset secret is warned about at start-up

    def routes(self) -> dict[str, Route]:
        """The current routes (:func:`webhook_routes`), recomputed when the loaded flows
        changed; each secret's variable missing from the environment is warned about
        once."""
        flows = list(self.registry.flows.items())  # a copy: reloads replace the dict's items
        versions = tuple(sorted((n, f.version) for n, f in flows))
        with self._lock:  # the listener's threads and its watch
            if versions != self._routes[0]:
                routes = webhook_routes(self.registry)
                for route in routes.values():
                    self._secret(route)  # the warning at load
                self._routes = (versions, routes)
            return self._routes[1]

    def _secret(self, route: Route) -> bytes | None:
        """The route's secret from the environment (``None``: unset or empty; warned
        about once per sensor and variable)."""
        name = route.spec.secret_env()
        if name is None:
            return None
        value = self.environ.get(name)
        if value:
            return value.encode()
        if (route.sensor, name) not in self._warned:
            self._warned.add((route.sensor, name))
            log.warning(
                "webhook sensor %s (%s): environment variable %s is not set: every request "
                "to %s is answered 401",
                route.sensor,
                route.file,
                name,
                route.spec.path,
            )
        return None

    def open(self, method: str, path: str, headers: Mapping[str, str]) -> Reply | Route:
        """The checks made before the body is read: the path (404), the method (405), a
        bearer token (401). Returns the :class:`Route` to :meth:`accept` the body on, or
        the :class:`Reply` that ends the request. ``headers``: lower-cased names."""
        route = self.routes().get(path)
        if route is None:
            return _error(404, "no webhook here")
        if method != "POST":
            return _error(405, "only POST")
        spec = route.spec
        if spec.unauthenticated:
            if self.exposed:
                log.warning(
                    "webhook sensor %s: unauthenticated, refused on a listener beyond loopback",
                    route.sensor,
                )
                return _error(403, "unauthenticated webhook served on loopback only")
            return route
        if spec.token_env is not None:
            secret = self._secret(route)
            given = headers.get("authorization", "")
            scheme, _, token = given.partition(" ")
            if (
                secret is None
                or scheme.lower() != "bearer"
                or not hmac.compare_digest(token.strip().encode(), secret)
            ):
                return _error(401, "wrong or missing bearer token")
        return route

    def accept(self, route: Route, headers: Mapping[str, str], body: bytes) -> Reply:
        """The checks on the body (the signature: 401; JSON: 400), then the event stored
        and committed: ``202`` with ``{"event": id}``. Raises what storing raises (a
        database error: the listener answers 503)."""
        spec, hidden = route.spec, {"authorization"}
        if spec.hmac is not None:
            header = spec.hmac.header.lower()
            hidden.add(header)
            secret = self._secret(route)
            given = headers.get(header, "")
            if secret is None:
                return _error(401, "bad signature")
            want = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
            if not hmac.compare_digest(given.strip().encode(), want.encode()):
                return _error(401, "bad signature")
        try:
            parsed = json.loads(body, parse_constant=_refuse)
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError too
            return _error(400, "the body is not JSON")
        kept = {k: v for k, v in headers.items() if k not in hidden}
        payload = {"body": parsed, "headers": kept}
        event_id = store_event(self.engine, route.sensor, uuid.uuid4().hex, payload)
        log.debug("webhook %s: event %d stored", route.sensor, event_id)
        if self.on_event is not None:
            self.on_event()
        return Reply(202, {"event": event_id})
