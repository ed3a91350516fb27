"""Durations as written in flow files: ``"250ms"``, ``"30s"``, ``"5m"``, ``"4h"``, ``"2d"``.

Compound forms such as ``"1h30m"`` are accepted too; a bare number (``30``, ``0.5``,
``"30"``) is a number of seconds. Everything is returned as float seconds.
"""

from __future__ import annotations

import math
import re

UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
"""Seconds per unit suffix."""

_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)")
_WHOLE = re.compile(r"^(?:\s*(?:\d+(?:\.\d+)?|\.\d+)\s*(?:ms|s|m|h|d))+\s*$")
_NUMBER = re.compile(r"^\s*(?:\d+(?:\.\d+)?|\.\d+)\s*$")

_EXPECTED = "expected a duration such as 250ms, 30s, 5m, 4h, 2d (or a number of seconds)"


def parse_duration(value: str | int | float) -> float:
    """Parse a duration into float seconds.

    Args:
        value: ``"250ms"``, ``"30s"``, ``"5m"``, ``"4h"``, ``"2d"``, a compound such as
            ``"1h30m"``, or a non-negative int/float (or numeric string) of seconds.

    Returns:
        The duration in seconds (``float``, never negative).

    Raises:
        ValueError: for negative, non-finite, empty or unparsable values (the message
            names the value and the accepted forms).
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: {_EXPECTED}")
    if isinstance(value, int | float):
        seconds = float(value)
        if math.isnan(seconds) or math.isinf(seconds):
            raise ValueError(f"invalid duration {value!r}: {_EXPECTED}")
        if seconds < 0:
            raise ValueError(f"invalid duration {value!r}: durations cannot be negative")
        return seconds
    if not isinstance(value, str):
        raise ValueError(f"invalid duration {value!r}: {_EXPECTED}")
    text = value.strip().lower()
    if text.startswith("-"):
        raise ValueError(f"invalid duration {value!r}: durations cannot be negative")
    if _NUMBER.match(text):
        return float(text)
    if not text or not _WHOLE.match(text):
        raise ValueError(f"invalid duration {value!r}: {_EXPECTED}")
    return sum(float(num) * UNITS[unit] for num, unit in _PART.findall(text))


def format_duration(seconds: float) -> str:
    """Format float seconds compactly for humans (``90`` → ``"1m30s"``, ``0.25`` → ``"250ms"``).

    Args:
        seconds: a non-negative number of seconds.
    """
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out = []
    rest = round(seconds)
    for unit in ("d", "h", "m", "s"):
        size = int(UNITS[unit])
        if rest >= size:
            out.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(out) or "0s"
