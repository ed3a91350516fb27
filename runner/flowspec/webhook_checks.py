"""Webhook sensors across flow files: each ``webhook.path`` is served by one sensor only.

A path's own shape (starts with ``/``) and its authentication (exactly one of
``token_env``, ``hmac`` or ``unauthenticated: true``) are checked by the model
(``runner.flowspec.spec_sensors.WebhookSpec``); uniqueness needs every flow of the folder
(``runner.flowspec.registry.FlowRegistry``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from runner.flowspec.compiled import CompiledFlow


def webhook_problems(
    flows: Iterable[CompiledFlow],
) -> Iterator[tuple[CompiledFlow, str, tuple[str | int, ...]]]:
    """``(flow, message, loc)`` for each webhook sensor whose ``path`` an earlier one (by
    file path, then sensor name) already serves; ``loc`` points at the second one's
    ``path``."""
    first: dict[str, tuple[CompiledFlow, str]] = {}
    for flow in sorted(flows, key=lambda f: f.path):
        for name, spec in sorted((flow.sensors or {}).items()):
            hook = getattr(spec, "webhook", None)
            if hook is None:
                continue
            seen = first.setdefault(hook.path, (flow, name))
            if seen != (flow, name):
                where = "this file" if seen[0] is flow else Path(seen[0].path).name
                yield (
                    flow,
                    f"webhook path '{hook.path}' is already served by sensor '{seen[1]}' "
                    f"of {where}: each path belongs to one webhook sensor",
                    ("sensors", name, "webhook", "path"),
                )
