"""Instance data given on the command line (``flowrun start F --data JSON key=value...``),
parsed within bounds: anything the CLI cannot accept is one ``UserError`` line, exit 2.

The bounds (``docs/limits.md``):

- :data:`MAX_DATA_BYTES`: all the data text of one command together (1 MiB). Linux caps
  one argument at 128 KiB anyway; handlers that need more read a file.
- :data:`MAX_DATA_DEPTH`: nesting of objects and arrays (64, as for flow files): Python's
  JSON decoder recurses, and every worker decodes and encodes the data of each attempt.
- Strict JSON: ``NaN``, ``Infinity`` and numbers beyond a double (``1e999``) are refused
  in ``--data`` (PostgreSQL's JSON columns refuse them; SQLite's would store invalid JSON).
  In a ``key=value`` pair such a value is kept as the string it is, like any value that
  is not JSON.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from runner.errors import UserError

MAX_DATA_BYTES = 1024 * 1024
"""Most characters of data (``--data`` and every ``key=value`` together) one command takes."""
MAX_DATA_DEPTH = 64
"""Deepest nesting of JSON objects and arrays in command-line data."""

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


class _NotStrict(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotStrict(f"number {text} is out of range")
    return value


def _constant(name: str) -> float:
    raise _NotStrict(f"{name} is not allowed (JSON has no NaN or Infinity)")


def too_deep(text: str, limit: int = MAX_DATA_DEPTH) -> int | None:
    """The 0-based offset of the first ``[`` or ``{`` of ``text`` nested deeper than
    ``limit`` (strings skipped), or ``None``. Linear time, no recursion."""
    depth = 0
    for m in _TOKENS.finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
            if depth > limit:
                return m.start()
        elif ch in "]}":
            depth -= 1
    return None


def strict_json(text: str, what: str):
    """Decode ``text`` as strict JSON within :data:`MAX_DATA_DEPTH`.

    Raises:
        UserError: (exit 2) not JSON, too deep, NaN/Infinity or an out-of-range number;
            the message starts with ``what``.
    """
    at = too_deep(text)
    if at is not None:
        raise UserError(
            f"{what}: nested too deep at character {at + 1} (at most {MAX_DATA_DEPTH} "
            "levels of objects and arrays, see docs/limits.md)",
            2,
        )
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_constant)
    except _NotStrict as exc:
        raise UserError(f"{what}: {exc}", 2) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{what}: not valid JSON: {exc}", 2) from None
    except ValueError:  # Python converts at most 4300 digits (sys.get_int_max_str_digits)
        raise UserError(f"{what}: a number too long (more than 4300 digits)", 2) from None
    except RecursionError:  # pragma: no cover - too_deep() comes first
        raise UserError(f"{what}: nested too deep", 2) from None


def parse_data(data_json: str | None, pairs: tuple[str, ...]) -> dict[str, Any]:
    """The data of ``flowrun start``: the ``--data`` object, updated by ``key=value`` pairs.

    A pair's value that is strict JSON is decoded, any other value kept as its string.

    Raises:
        UserError: (exit 2) more than :data:`MAX_DATA_BYTES` in all, ``--data`` not a
            strict JSON object, a value nested too deep, or a pair without ``=`` or key.
    """
    total = len(data_json or "") + sum(len(p) for p in pairs)
    if total > MAX_DATA_BYTES:
        raise UserError(
            f"data too large: {total} characters (at most {MAX_DATA_BYTES}, see "
            "docs/limits.md; pass a file path and read it in the handler instead)",
            2,
        )
    data: dict[str, Any] = {}
    if data_json:
        data = strict_json(data_json, "--data")
        if not isinstance(data, dict):
            raise UserError("--data must be a JSON object", 2)
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UserError(f"bad data argument {pair!r}: expected key=value", 2)
        try:
            data[key] = strict_json(value, f"data {key!r}")
        except UserError as exc:
            if "nested too deep" in str(exc):
                raise
            data[key] = value
    return data
