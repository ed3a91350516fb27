"""The webhook sensors' side of the daemon's HTTP listener: the door they are served
through (``runner.sensors.webhook.WebhookDoor``), woken rules, and the start-up refusal
of an unauthenticated webhook on a listener reachable beyond loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sqlalchemy import Engine

from runner.errors import ConfigError
from runner.flowspec.registry import FlowRegistry
from runner.sensors.webhook import WebhookDoor, unauthenticated
from runner.service.http_listener import loopback


def webhook_door(
    engine: Engine,
    registry: FlowRegistry,
    address: tuple[str, int],
    loop: asyncio.AbstractEventLoop,
    kick: Callable[[], None],
) -> WebhookDoor:
    """The door of a listener at ``address`` (``(host, port)``): a stored event calls
    ``kick`` on ``loop`` (the rules look at once).

    Raises:
        ConfigError: ``address`` is beyond loopback and a loaded webhook sensor is
            ``unauthenticated`` (one line: its file, line and column).
    """
    exposed = not loopback(address[0])
    if exposed:
        for route in unauthenticated(registry):
            flow = registry.flows[route.sensor.partition(".")[0]]
            name = route.sensor.partition(".")[2]
            loc = ("sensors", name, "webhook", "unauthenticated")
            line, col = flow.spec.position(loc) if flow.spec is not None else (None, None)
            raise ConfigError(
                f"{route.file}:{line or 1}:{col or 1}: webhook sensor '{name}' is unauthenticated: "
                f"refused on {address[0]}:{address[1]}, beyond loopback (give it token_env "
                "or hmac, or listen on 127.0.0.1)"
            )

    def woken() -> None:
        try:
            loop.call_soon_threadsafe(kick)
        except RuntimeError:  # the loop closed: the daemon is ending
            pass

    return WebhookDoor(engine, registry, exposed=exposed, on_event=woken)
