"""Small pure formatting helpers for the console (durations, ages, sparklines, bars); the
CLI's tables use the same ``span``, ``due_in`` and ``lock``.

Everything here is a function of its arguments (the console passes its injected clock's
``now``), so renders are deterministic under a fixed clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runner.lifecycle import in_window
from runner.ops.views import webhook_what

SPARK = "▁▂▃▄▅▆▇█"


def span(seconds: float | None) -> str:
    """A compact duration: ``850ms``, ``42s``, ``7m``, ``3h``, ``2d`` (``""`` for ``None``)."""
    if seconds is None:
        return ""
    s = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if s < 1:
        return f"{sign}{int(s * 1000)}ms"
    if s < 60:
        return f"{sign}{int(s)}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s" if s < 600 else f"{sign}{int(s // 60)}m"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def due_in(due_at: float | None, now: float, status: str, *, running: bool = False) -> str:
    """When the instance is next tried: ``running`` (an attempt runs now, when
    ``running``), ``now``, ``12s``, ``event`` (waits for an ``on:`` event) or ``""``
    (terminal, or paused: nothing is due until it is resumed). Never negative."""
    if status in ("completed", "failed", "killed", "paused"):
        return ""
    if running:
        return "running"
    if due_at is None:
        return "event"
    delta = due_at - now
    return "now" if delta <= 0 else span(delta)


def lock(locked_by: str | None, locked_until: float | None, now: float) -> str:
    """``owner 12s`` while the lease holds, ``owner expired`` after, ``""`` when unlocked."""
    if not locked_by:
        return ""
    if locked_until is None or locked_until < now:
        return f"{locked_by} expired"
    return f"{locked_by} {int(locked_until - now)}s"


def budget_used(state_errors: Sequence[float] | None, now: float, window: float | None) -> int:
    """Errors inside the sliding window (all recorded ones when the window is unknown)."""
    return len(in_window(list(state_errors or []), now, window))


def budget(used: int, max_errors: int | None) -> str:
    """``3/8`` (used over max) or just ``3`` when the policy is unknown."""
    return f"{used}/{max_errors}" if max_errors is not None else str(used)


def sparkline(values: Sequence[int], width: int | None = None) -> str:
    """Block-character sparkline of ``values`` (last ``width`` values), scaled to the max."""
    vals = list(values)[-width:] if width else list(values)
    top = max(vals, default=0)
    if top <= 0:
        return SPARK[0] * len(vals)
    return "".join(SPARK[min(7, int(v * 7 / top + 0.999))] if v else SPARK[0] for v in vals)


def bar(used: int, total: int, width: int = 20) -> str:
    """A burn-down bar: ``█`` for spent budget, ``░`` for what is left."""
    if total <= 0:
        return ""
    filled = min(width, round(width * used / total))
    return "█" * filled + "░" * (width - filled)


def pretty_json(value: Any) -> str:
    """Indented, key-sorted JSON (``null`` for ``None``), non-ASCII text as it is (show it
    through ``runner.tui.literal``, which escapes what the terminal must not see)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def command_label(command: dict[str, Any]) -> str:
    """A ``commands`` row's command with its event, if any: ``send approve``, ``pause``."""
    event = (command.get("args") or {}).get("event")
    return f"{command['command']} {event}" if event else str(command["command"])


def waits_for(
    status: str, due_at: float | None, events: Sequence[str] | None, *, running: bool = False
) -> str:
    """What an instance in an external state waits for: ``"an event: approve, reject"``
    while it is runnable with nothing due (``events``: its state's ``on:`` events, ``None``
    when the state is not external or unknown); ``""`` otherwise."""
    if events is None or status != "runnable" or due_at is not None or running:
        return ""
    if not events:
        return "an event (its state declares none: only an operator can move it)"
    return "an event: " + ", ".join(events)


def event_what(payload: Any) -> str:
    """What a sensor event (its ``payload``, a dict) says happened: a tail sensor's file
    name and line (``app.log: ERROR 502 …``), a files sensor's path, a clock's tick, a
    webhook's body (``runner.ops.views.webhook_what``); any
    other payload as compact JSON. Not yet made visible: show it through
    ``runner.tui.literal``."""
    if not isinstance(payload, dict):
        return "" if payload is None else json.dumps(payload, default=str, ensure_ascii=False)
    hook = webhook_what(payload)
    if hook is not None:
        return hook
    if "line" in payload:
        name = str(payload.get("file") or "").rsplit("/", 1)[-1]
        return f"{name}: {payload['line']}" if name else str(payload["line"])
    if "path" in payload:
        return str(payload["path"])
    if "tick" in payload:
        return f"tick {payload['tick']}"
    return json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)


def delivery_text(d: dict[str, Any]) -> str:
    """What became of one delivery (a dict of ``runner.ops.queries.event_deliveries``):
    ``webhook POST http://...: delivered at T after 1 try (HTTP 200), 99 suppressed
    (once_per)``; ``FAILED after 3 tries (...)``; ``pending, next try T (1 try so far)``.
    The last result's first line only. Not yet made visible: show it literally."""
    target = d.get("target") or {}
    if "exec" in target:
        what = "exec " + " ".join(str(a) for a in target["exec"])
    else:
        hook = target.get("webhook") or {}
        what = f"webhook {hook.get('method', 'POST')} {hook.get('url')}"
    tries = f"{d['attempts']} {'try' if d['attempts'] == 1 else 'tries'}"
    if d["status"] == "delivered":
        state = f"delivered at {d['delivered_at']} after {tries}"
    elif d["status"] == "failed":
        state = f"FAILED after {tries}"
    else:
        state = f"pending, next try {d['due_at']} ({tries} so far)"
    lines = str(d.get("last_result") or "").split("\n")
    last = next((ln.strip() for ln in lines if ln.strip()), "")
    result = f" ({last})" if last else ""
    folded = f", {d['suppressed']} suppressed (once_per)" if d.get("suppressed") else ""
    before = f", says {d['folded_before']} suppressed before" if d.get("folded_before") else ""
    return f"{what}: {state}{result}{folded}{before}"


def thousands(n: int) -> str:
    """``1,000,000``."""
    return f"{n:,}"
