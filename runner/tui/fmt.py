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


def one_line(text: str | None, limit: int = 200) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    if not text:
        return ""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def pretty_json(value: Any) -> str:
    """Indented, key-sorted JSON (``null`` for ``None``)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def thousands(n: int) -> str:
    """``1,000,000``."""
    return f"{n:,}"
