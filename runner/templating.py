"""Placeholders in ``exec`` arguments and rule data: ``{data.path}``, ``{event.code}``.

A placeholder is a dotted path of keys into nested dicts, nothing else: no attribute
access, no indexing, no format specs or conversions, no expressions. ``{{`` and ``}}``
are literal braces. The result of :func:`render` is meant to be ONE argv element (or
one data value); it is never interpreted further (no shell, no second formatting
pass), so a value such as ``$(touch pwned)`` comes out verbatim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*$")

# A parsed template: literal strings and placeholder paths (tuples of keys).
_Part = str | tuple[str, ...]

#: A template made a function of the context (:func:`compiled`).
Fill = Callable[[Mapping[str, Any]], str]

_EXPECTED_PLACEHOLDER = (
    "expected a dotted key path such as {data.path} or {event.code} (no indexing, "
    "attributes, format specs or expressions; use '{{' and '}}' for literal braces)"
)


@lru_cache(maxsize=4096)
def _parse(template: str) -> tuple[_Part, ...]:
    parts: list[_Part] = []
    literal: list[str] = []
    i, n = 0, len(template)
    while i < n:
        ch = template[i]
        if ch == "{":
            if template.startswith("{{", i):
                literal.append("{")
                i += 2
                continue
            end = template.find("}", i + 1)
            if end < 0:
                raise ValueError(
                    f"unclosed '{{' at offset {i} in {template!r} (use '{{{{' for a brace)"
                )
            inner = template[i + 1 : end]
            if not _PATH.match(inner):
                raise ValueError(
                    f"invalid placeholder {{{inner}}} in {template!r}: " + _EXPECTED_PLACEHOLDER
                )
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(tuple(inner.split(".")))
            i = end + 1
        elif ch == "}":
            if template.startswith("}}", i):
                literal.append("}")
                i += 2
                continue
            raise ValueError(f"single '}}' at offset {i} in {template!r} (use '}}}}' for a brace)")
        else:
            literal.append(ch)
            i += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def placeholders(template: str) -> list[str]:
    """Return the dotted paths used in ``template``, in order (``["data.path", ...]``).

    Raises:
        ValueError: if the template is malformed (unbalanced braces, or a placeholder
            that is not a plain dotted key path).
    """
    return [".".join(p) for p in _parse(template) if isinstance(p, tuple)]


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def lookup(context: Mapping[str, Any], path: str) -> object:
    """Return the value at dotted ``path`` (``"data.path"``) in nested mappings.

    Raises:
        KeyError: naming the full path when any key is missing or a non-mapping is crossed.
    """
    return _walk(context, path.split("."), path)


def _walk(context: Mapping[str, Any], keys: Sequence[str], path: str) -> object:
    """The value at ``keys`` in nested mappings; ``KeyError(path)`` when one is missing."""
    value: object = context
    for key in keys:
        if not (type(value) is dict or isinstance(value, Mapping)) or key not in value:
            raise KeyError(path)
        value = value[key]
    return value


def render(template: str, context: Mapping[str, Any]) -> str:
    """Replace each ``{a.b.c}`` in ``template`` with the value at that key path in ``context``.

    Args:
        template: text with placeholders; ``{{``/``}}`` are literal braces.
        context: nested dicts, e.g. ``{"data": {...}, "event": {...}}``.

    Returns:
        The rendered string. Strings are inserted verbatim; ``None`` becomes ``""``,
        booleans ``true``/``false``, numbers ``str()``, lists/dicts compact JSON.

    Raises:
        KeyError: the dotted path of the first missing placeholder.
        ValueError: the template is malformed.
    """
    return compiled(template)(context)


@lru_cache(maxsize=4096)
def compiled(template: str) -> Fill:
    """:func:`render` of ``template`` as a function of the context, the template parsed
    once: a template without placeholders gives its text with no work (an ``env`` value
    such as ``gold`` is rendered for every attempt: ``runner.handlers.secrets``).

    Raises:
        ValueError: the template is malformed (at once; the function raises ``KeyError``
            as :func:`render` does).
    """
    parsed = _parse(template)
    if not any(isinstance(p, tuple) for p in parsed):
        text = "".join(parsed)  # type: ignore[arg-type]  # only strings
        return lambda context: text
    parts = tuple(p if isinstance(p, str) else (p, ".".join(p)) for p in parsed)

    def fill(context: Mapping[str, Any]) -> str:
        out: list[str] = []
        for part in parts:
            if isinstance(part, str):
                out.append(part)
            else:
                keys, path = part
                out.append(_text(_walk(context, keys, path)))
        return "".join(out)

    return fill


def render_value(template: str, context: Mapping[str, Any]) -> object:
    """A rule's ``data`` value: a template that is exactly one placeholder (``"{event.size}"``)
    gives the value itself, its type kept (a number stays a number, a list a list);
    anything else is :func:`render`-ed to a string.

    Raises:
        KeyError: the dotted path of the first missing placeholder.
        ValueError: the template is malformed.
    """
    parts = _parse(template)
    if len(parts) == 1 and isinstance(parts[0], tuple):
        return lookup(context, ".".join(parts[0]))
    return render(template, context)


#: ``{event.field}`` inside a rule selector's regex (other braces, such as ``\d{3}``, are
#: regex syntax and left alone).
_EVENT_REF = re.compile(r"\{event\.([A-Za-z_][A-Za-z0-9_]*)\}")


def event_refs(pattern: str) -> list[str]:
    """The event field names a selector regex refers to as ``{event.field}``, in order."""
    return _EVENT_REF.findall(pattern)


def render_event_refs(pattern: str, event: Mapping[str, Any]) -> str:
    """``pattern`` (a regex) with each ``{event.field}`` replaced by the field's value,
    ``re.escape``-d so it matches literally (``None`` becomes ``""``).

    Raises:
        KeyError: ``event.<field>`` when the event has no such field.
    """

    def value(m: re.Match[str]) -> str:
        if m.group(1) not in event:
            raise KeyError(f"event.{m.group(1)}")
        return re.escape(_text(event[m.group(1)]))

    return _EVENT_REF.sub(value, pattern)


#: Longest label kept whole, in characters; a longer one ends with "…".
LABEL_WIDTH = 40


def _path_like(text: str) -> bool:
    """Whether ``text`` looks like a file path: it names a folder (``/``) and either starts
    like a path (``/``, ``./``, ``../``, ``~/``) or has no white space (a log line such as
    ``ERROR [cache] evicted [/var/lib/app] entries`` is not a path)."""
    if "/" not in text.rstrip("/"):
        return False
    return text.startswith(("/", "./", "../", "~/")) or not any(c.isspace() for c in text)


def _short(value: object) -> str:
    """A path-like string (:func:`_path_like`) shortened to its last folder and file name."""
    text = _text(value)
    if _path_like(text):
        parts = [p for p in text.rstrip("/").split("/") if p]
        text = "/".join(parts[-2:])
    return text


def render_label(template: str, context: Mapping[str, Any], width: int = LABEL_WIDTH) -> str | None:
    """An instance's label: ``template`` rendered over ``context`` (``{"data": ...}``),
    each path-like value shortened to ``folder/name`` and the whole cut to ``width``
    characters (the last one ``…``).

    Returns ``None`` when a placeholder names a missing key or the template is malformed
    (a label is a convenience, never an error).
    """
    out: list[str] = []
    try:
        for part in _parse(template):
            out.append(part if isinstance(part, str) else _short(lookup(context, ".".join(part))))
    except (KeyError, ValueError):
        return None
    text = " ".join("".join(out).split())
    return text if len(text) <= width else text[: width - 1] + "…"
