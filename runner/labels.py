"""Worker labels and the ``runs_on`` requirements matched against them.

A daemon has labels, ``name=value`` pairs (``flowrun --daemon --labels gpu=1,site=paris``
or ``FLOWRUN_LABELS``), plus ``host`` (its host name) unless given. A state (or a
``defaults``, or a sensor) may say ``runs_on: {gpu: "1"}``: its attempts run only on a
daemon whose labels include every pair of the requirement (a subset test, values compared
as text). A state's values are templates over the instance data and the event that
started it (``{data.x}``, ``{event.host}``), rendered when the instance enters the state.

The resolved requirement is stored as canonical JSON text (:func:`canonical`: keys
sorted, no spaces), ``None`` for none; the claim compares it with the worker's labels
inside its own statement (``runner.store.hot.claim_statement``). Pure: no I/O, nothing of
flowrun but ``templating``.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.templating import placeholders, render

#: A label's name: a letter or ``_``, then letters, digits, ``_``, ``.``, ``-``.
KEY_RE = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
_KEY = re.compile(KEY_RE)
#: Longest label name and value (characters).
MAX_KEY = 63
MAX_VALUE = 200
#: The label every daemon has: its host name.
HOST = "host"


#: ``then:`` of a routing timeout that ends the instance.
FAILED = "failed"


@dataclass(frozen=True)
class Routing:
    """A handler state's routing: ``runs_on`` (label -> template; ``None``: any worker),
    ``after`` (seconds of no live matching worker before the move; ``None``: wait for
    ever) and ``then`` (a state, or ``failed``)."""

    runs_on: dict[str, str] | None = None
    after: float | None = None
    then: str = FAILED


NO_ROUTING = Routing()


def parse(text: str | None, *, host: str | None = None) -> dict[str, str]:
    """Labels from ``"gpu=1,site=paris"`` (spaces around items ignored; an empty text
    gives none), plus ``host`` (``host``'s value, default ``socket.gethostname()``)
    unless the text names it.

    Raises:
        ValueError: an item without ``=``, a bad name (see :data:`KEY_RE`), a name given
            twice, a name or value too long, or a value with ``,`` (the separator).
    """
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise ValueError(f"label {item!r} has no '=': expected NAME=VALUE, e.g. gpu=1")
        check_key(key)
        if len(value) > MAX_VALUE:
            raise ValueError(f"label {key}'s value is longer than {MAX_VALUE} characters")
        if key in labels:
            raise ValueError(f"label {key} given twice")
        labels[key] = value
    if HOST not in labels:
        labels[HOST] = host if host is not None else socket.gethostname()
    return labels


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid label name, else raise ``ValueError``."""
    if not _KEY.match(key) or len(key) > MAX_KEY:
        raise ValueError(
            f"bad label name {key!r}: a letter or '_' first, then letters, digits, '_', '.' "
            f"or '-' (at most {MAX_KEY})"
        )
    return key


def canonical(pairs: Mapping[str, str] | None) -> str | None:
    """The stored text of labels or of a requirement: JSON, keys sorted, no spaces;
    ``None`` for none (``None`` or empty)."""
    if not pairs:
        return None
    return json.dumps(dict(sorted(pairs.items())), separators=(",", ":"), ensure_ascii=False)


def decode(text: str | None) -> dict[str, str]:
    """The pairs of a stored text (:func:`canonical`); ``{}`` for ``None``."""
    return dict(json.loads(text)) if text else {}


def covers(labels: Mapping[str, str], required: Mapping[str, str] | None) -> bool:
    """Do ``labels`` include every pair of ``required`` (none: always)?"""
    return all(labels.get(k) == v for k, v in (required or {}).items())


def show(required: Mapping[str, str] | str | None) -> str:
    """``gpu=1,site=paris`` (a requirement or labels, or their stored text)."""
    pairs = decode(required) if isinstance(required, str) or required is None else required
    return ",".join(f"{k}={v}" for k, v in sorted(pairs.items()))


#: A heartbeat older than this many of its worker's intervals is stale
#: (``runner.ops.liveness.STALE_BEATS``).
STALE_BEATS = 3
#: The interval of a row that does not record its own (``runner.ops.liveness.HEARTBEAT``).
HEARTBEAT = 2.0


@dataclass(frozen=True)
class Match:
    """The workers whose labels cover one requirement: ``alive`` (how many are alive
    now), ``last`` (the last moment one of the others was alive, epoch s; ``None``:
    none ever recorded)."""

    alive: int
    last: float | None


def match(rows: Sequence[Any], required: Mapping[str, str], at: float) -> Match:
    """Which of ``rows`` (workers' ``(labels, heartbeat_at, heartbeat_every,
    stopped_at)``: ``runner.store.routing.worker_rows``) cover ``required`` at ``at``
    (epoch s)."""
    alive, last = 0, None
    for labels, beat, every, stopped in rows:
        if not covers(decode(labels), required):
            continue
        ends = stopped if stopped is not None else beat + STALE_BEATS * (every or HEARTBEAT)
        if stopped is None and ends >= at:
            alive += 1
        else:
            last = ends if last is None else max(last, ends)
    return Match(alive, last)


def needs_event(templates: Mapping[str, str] | None) -> list[str]:
    """The event fields ``templates`` (a ``runs_on`` map) name (``{event.host}`` →
    ``host``), in order, once each."""
    out: list[str] = []
    for value in (templates or {}).values():
        for path in placeholders(value):
            head, _, rest = path.partition(".")
            if head == "event" and rest and rest.split(".")[0] not in out:
                out.append(rest.split(".")[0])
    return out


def resolve(
    templates: Mapping[str, str] | None,
    data: Mapping[str, Any] | None,
    event: Mapping[str, Any] | None = None,
) -> str | None:
    """The requirement of a ``runs_on`` map (label → template) for an instance with
    ``data`` started by an event with fields ``event`` (``None``: none), as stored
    (:func:`canonical`; ``None`` when there is no requirement).

    A placeholder naming a field that is missing renders as an empty text, so the
    requirement stands and no worker matches it (the state's ``routing_timeout`` then
    decides): a requirement is never dropped silently.
    """
    if not templates:
        return None
    context = {"data": dict(data or {}), "event": dict(event or {})}
    out: dict[str, str] = {}
    for key, template in templates.items():
        try:
            out[key] = render(template, context)
        except KeyError:
            out[key] = ""
    return canonical(out)
