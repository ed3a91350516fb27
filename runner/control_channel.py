"""The control channel of ``exec`` handlers: the line protocol, both of its ends.

Handler authors import these through :mod:`runner.control` (their one public module);
flowrun's own modules import them from here (the daemon side: :func:`parse`, ``ENV``).

flowrun starts every ``exec`` handler with an extra pipe whose write end is the file
descriptor named by ``FLOWRUN_CONTROL_FD``. A handler writes one line per message:

``keepalive``
    "still working": resets the state's ``keepalive`` deadline (majordomo's keepalive).
``checkpoint <json object>``
    merges the object into the instance's data and stores it durably (fenced: nothing is
    stored once the instance was taken away); the next attempt or restart starts from it
    (majordomo's "update state").
``goto <state>``
    on exit 0, move to ``<state>`` (one of the state's ``next``/``to``) instead of ``next``.
``sleep <time>``
    on exit 0 (or 75), sleep in this state until ``<time>``: an ISO 8601 time
    (``2026-12-01T09:00:00Z``; without a zone it is UTC) or a duration from now (``15m``,
    ``4h``, ``2d``); nothing is spent (Metafora's ``Sleep``).

From a shell (or any language): ``echo keepalive > "/dev/fd/$FLOWRUN_CONTROL_FD"``, or
``python -m runner.control checkpoint '{"rows_done": 1000}'``. (bash also accepts
``>&"$FLOWRUN_CONTROL_FD"``; POSIX ``sh``/dash does not, since the descriptor number is
usually above 9.)

Lines are not acknowledged: flowrun stores a ``checkpoint`` as soon as it reads the line,
while the handler carries on. A handler that must know its checkpoint is stored before
going on should be a ``call`` handler (``ctx.checkpoint`` returns once it is durable).

Outside flowrun (no ``FLOWRUN_CONTROL_FD``) every call is a no-op, so handlers can be run
by hand. This module imports nothing of flowrun but :mod:`runner.durations` (a ground
module): a handler's ``python -m runner.control`` starts in a few milliseconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

#: The variable naming the control channel's file descriptor.
ENV = "FLOWRUN_CONTROL_FD"
#: An ``exec`` handler's exit code for "not yet" (``EX_TEMPFAIL``): tried again after
#: the state's ``try_interval``, nothing spent.
EXIT_NOT_YET = 75


def _send(line: str) -> bool:
    fd = os.environ.get(ENV)
    if not fd:
        return False
    data = (line.rstrip("\n") + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(int(fd), view)
        view = view[n:]
    return True


def data() -> dict[str, Any]:
    """The instance data this handler was started with: ``FLOWRUN_DATA`` (JSON, while it
    is at most 64 kB) or else the file named by ``FLOWRUN_DATA_FILE``; ``{}`` outside
    flowrun."""
    path = os.environ.get("FLOWRUN_DATA_FILE")
    if path:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return json.loads(os.environ.get("FLOWRUN_DATA") or "{}")


def keepalive() -> bool:
    """Signal that the handler is alive. Returns False outside flowrun."""
    return _send("keepalive")


def checkpoint(data: dict[str, Any]) -> bool:
    """Merge ``data`` (a JSON-serialisable dict) into the instance data, durably (not
    acknowledged: flowrun stores it once it reads the line). Returns False outside
    flowrun. Raises ``TypeError`` for anything but a dict."""
    if not isinstance(data, dict):
        raise TypeError("checkpoint needs a dict")
    return _send("checkpoint " + json.dumps(data, separators=(",", ":")))


def goto(state: str) -> bool:
    """On a clean exit, move to ``state`` instead of the state's ``next``. Returns False
    outside flowrun; raises ``ValueError`` for an empty name or one with whitespace."""
    if not state or any(c.isspace() for c in state):
        raise ValueError(f"bad state name {state!r}")
    return _send("goto " + state)


def sleep(until: str) -> bool:
    """On a clean exit, sleep in this state until ``until`` (ISO 8601 time or a duration
    such as ``"15m"``). Returns False outside flowrun; raises ``ValueError`` for
    neither."""
    wake_time(until)
    return _send("sleep " + until.strip())


def wake_time(text: str, now: float | None = None) -> float:
    """``text`` as epoch seconds (UTC): an ISO 8601 time (``Z`` or an offset; none means
    UTC) or a duration from ``now`` (``"15m"``, ``"90s"``, ``"2d"``, a number of seconds).

    Raises ``ValueError`` for neither.
    """
    from runner.durations import parse_duration

    text = text.strip()
    try:
        return (time.time() if now is None else now) + parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"bad time {text[:60]!r}: expected ISO 8601 (2026-12-01T09:00:00Z) or a "
            "duration (15m, 4h, 2d)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse(line: str) -> tuple[str, object]:
    """Parse one control line into ``(kind, value)``; raises ``ValueError`` if malformed.

    A ``sleep`` line's value is its wake time in epoch seconds (a duration counts from
    now)."""
    line = line.strip()
    kind, _, rest = line.partition(" ")
    if kind == "sleep" and rest.strip():
        return "sleep", wake_time(rest)
    if kind == "keepalive" and not rest:
        return "keepalive", None
    if kind == "goto" and rest.strip():
        return "goto", rest.strip()
    if kind == "checkpoint":
        value = json.loads(rest)
        if not isinstance(value, dict):
            raise ValueError("checkpoint needs a JSON object")
        return "checkpoint", value
    raise ValueError(f"unknown control line {line[:80]!r}")


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.control keepalive | checkpoint JSON | goto STATE | sleep TIME``."""
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m runner.control keepalive | checkpoint JSON | goto STATE | sleep TIME"
    try:
        if args == ["keepalive"]:
            keepalive()
        elif len(args) == 2 and args[0] == "checkpoint":
            checkpoint(json.loads(args[1]))
        elif len(args) == 2 and args[0] == "goto":
            goto(args[1])
        elif len(args) == 2 and args[0] == "sleep":
            sleep(args[1])
        else:
            print(usage, file=sys.stderr)
            return 2
    except (ValueError, TypeError) as exc:
        print(f"runner.control: {exc}", file=sys.stderr)
        return 2
    return 0
