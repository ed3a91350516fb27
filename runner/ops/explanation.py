"""What ``flowrun explain`` says, as values and as text: the :class:`Entry` lines of a
timeline and a forecast, the :class:`Explanation` holding them, the replay's
:class:`Track`, the wording of durations and backoffs, the entries read straight off the
rows (created, running, pruned), and :func:`render_text`.

Pure: ``runner.ops.explain`` builds the timeline, ``runner.ops.forecast`` what comes next.
Times are float epoch seconds, UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from runner.flowspec import deadlines
from runner.flowspec.policy import Backoff, Policy
from runner.literal import literal
from runner.ops.views import iso


@dataclass
class Entry:
    """One line of the timeline or the forecast.

    Attributes:
        at: epoch seconds (UTC) the entry is about (``None`` for a forecast without a time).
        kind: ``created``, ``attempt``, ``wait``, ``budget``, ``restart``, ``command``,
            ``rule``, ``version``, ``sleep``, ``running``, ``pruned`` (timeline) or ``due``,
            ``next_error``, ``next_restart`` (forecast).
        text: the sentence an operator reads.
        data: the same facts as fields, for ``--json``.
    """

    at: float | None
    kind: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Explanation:
    """What ``runner.ops.explain.explain`` returns: the instance's summary, timeline and
    forecast, and the replay's end (``track``: not part of the JSON)."""

    instance: dict[str, Any]
    timeline: list[Entry]
    forecast: list[Entry]
    track: Track | None = field(default=None, compare=False)  # where the replay ended

    def as_json(self, iso: Callable[[float | None], str | None]) -> dict[str, Any]:
        """A JSON-ready dict; ``iso`` turns epoch seconds into text (``runner.ops.views.iso``)."""

        def entry(e: Entry) -> dict[str, Any]:
            return {**asdict(e), "at": iso(e.at), "at_epoch": e.at}

        return {
            "instance": self.instance,
            "timeline": [entry(e) for e in self.timeline],
            "forecast": [entry(e) for e in self.forecast],
        }


def secs(value: float | None) -> str:
    """A duration for people: ``250ms``, ``4.2s``, ``5m``, ``1h 30m``, ``2d 3h``."""
    if value is None:
        return "none"
    v = max(0.0, float(value))
    if v < 1:
        return f"{v * 1000:.0f}ms"
    if v < 60:
        return f"{v:.3g}s" if v < 10 else f"{v:.0f}s"
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if v >= size:
            whole, rest = divmod(v, size)
            rest_units = int(rest // subsize)
            return f"{int(whole)}{unit}" + (f" {rest_units}{sub}" if rest_units else "")
    whole, rest = divmod(v, 60)
    return f"{int(whole)}m" + (f" {int(rest)}s" if int(rest) else "")


def first_line(text: str | None, limit: int = 160) -> str:
    """The first non-empty line of ``text`` (lines end at a newline only: a carriage
    return or other control stays in the line, to be shown literally), cut to ``limit``
    characters."""
    for line in (text or "").split("\n"):
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def describe_backoff(backoff: Backoff, n: int) -> str:
    """``"backoff 2: 10s, full jitter: a delay drawn from 0s to 10s"``."""
    base, low, high = backoff.bounds(n)
    if backoff.jitter == "none":
        return f"backoff {n}: {secs(base)} (no jitter)"
    drawn = f"a delay drawn from {secs(low)} to {secs(high)}"
    return f"backoff {n}: {secs(base)}, {backoff.jitter} jitter: {drawn}"


def exhausted_target(policy: Policy) -> str:
    """What ``on_exhausted`` does, in words."""
    target = policy.on_exhausted
    if target in ("failed", "paused"):
        return f"the instance becomes {target} (on_exhausted: {target})"
    return f"the instance moves to state {target!r} (on_exhausted: {target})"


@dataclass
class Track:
    """What the replay (``runner.ops.explain``) knows at a point in time: it mirrors the
    instance's state, status and counters in the state (``errors``: the error times, epoch
    s, still in the window; ``restarts``); the forecast (``runner.ops.forecast``) reads
    why it waits. A handler's sleep until a time already past is replayed ``sleeping``
    (the attempt row keeps no wake time), where the worker made it ``runnable``."""

    state: str
    version: str
    errors: list[float] = field(default_factory=list)
    restarts: int = 0
    status: str = "runnable"
    wait_cause: str | None = None
    wait_from: float | None = None
    wait_data: dict[str, Any] = field(default_factory=dict)
    interrupts: list[str] = field(default_factory=list)


def pruned_entry(before: float) -> Entry:
    """Where retention cut the history of a live instance (``instances.history_from``,
    epoch s)."""
    return Entry(
        before,
        "pruned",
        f"attempts before {iso(before)} pruned (retention): the timeline up to here is incomplete",
        {"before": before},
    )


def created_entry(
    inst: dict[str, Any], event: dict[str, Any] | None, state: str, version: str
) -> Entry:
    """The first timeline entry: how instance ``inst`` (an ``instances`` row as a dict) was
    created (by hand or by a rule on sensor ``event``, an ``events`` row or ``None``), in
    ``state`` of flow ``version``."""
    how = "by hand (flowrun start, the console or the API)"
    data: dict[str, Any] = {"state": state, "version": version}
    if event is not None:
        sensor = event["sensor"]
        payload = event.get("payload") or {}
        what = payload.get("path") or payload.get("line") or event["key"]
        how = f"by a rule on event #{event['id']} of sensor {sensor} ({first_line(str(what), 80)})"
        data.update(event_id=event["id"], sensor=sensor)
    elif inst.get("event_id") is not None:
        how = f"by a rule on event #{inst['event_id']}"
        data["event_id"] = inst["event_id"]
    return Entry(
        inst["created_at"],
        "created",
        f"created {how}, in state {state!r} (flow version {version})",
        data,
    )


def running_entry(a: dict[str, Any], inst: dict[str, Any], now: float) -> Entry:
    """The entry of attempt ``a`` (an ``attempts`` row as a dict) still running at ``now``
    (epoch s) on instance ``inst``: for how long, and its lease."""
    lease = inst.get("locked_until")
    lease_txt = f"; its lease runs {secs(lease - now)} more" if lease and lease > now else ""
    if lease and lease <= now:
        lease_txt = (
            f"; its lease expired {secs(now - lease)} ago (its worker is gone: a worker "
            "will record the attempt lost)"
        )
    return Entry(
        a["started_at"],
        "running",
        f"attempt {a['attempt']} in {a['state']!r} on worker {a['worker']}: running for "
        f"{secs(now - (a['started_at'] or now))}{lease_txt}",
        {"attempt": a["attempt"], "state": a["state"], "worker": a["worker"]},
    )


def deadline_entry(inst: dict[str, Any], flow: Any, now: float) -> Entry | None:
    """The forecast's ``deadline`` line of a live instance with a pending deadline
    (``"deadline in 1h12m → escalate"``), ``None`` without one. ``flow``: its
    ``CompiledFlow`` (``None``: unknown, the time alone is shown)."""
    at = inst.get("deadline_at")
    if at is None or inst["status"] not in ("runnable", "sleeping", "paused"):
        return None
    found = deadlines.describe(flow, inst["state"], inst["state_changed"], inst["created_at"], at)
    d = found[1] if found and flow is not None else None
    then = d.then if d is not None else "?"
    data = {"due": at, "then": then, "scope": d.scope if d is not None else None}
    if at > now:
        return Entry(at, "deadline", f"deadline in {secs(at - now)} → {then}", data)
    late = f"deadline passed {secs(now - at)} ago → {then} (acting on it)"
    return Entry(at, "deadline", late, data)


def clock(ts: float) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS UTC``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_text(explanation: Explanation, now: float) -> str:
    """The text of ``explanation`` (an :class:`Explanation`) at ``now``
    (epoch seconds): what ``flowrun explain`` prints and the console shows. A header,
    the timeline (UTC clock time and seconds since the instance
    was created), and what happens next. Stored text in the entries (errors, labels,
    commands' arguments, rule actions) is shown literally (``runner.literal``): one
    line per entry, no control character."""
    inst = explanation.instance
    label = f" ({literal(inst['label'])})" if inst.get("label") else ""
    waits = inst.get("waits_for")
    if waits is not None:  # runnable, but nothing is due until one of these events
        label_events = " or ".join(literal(e) for e in waits) or "none accepted"
        waits = f", waits for an event: {label_events}"
    lines = [
        f"instance {inst['id']}{label} of flow {literal(inst['flow'])}: state "
        f"{literal(repr(inst['state']))}, status {inst['status']}{waits or ''} (flow version "
        f"{literal(inst['version'])})",
        f"{inst['attempts']} attempts, {inst['errors']} errors, {inst['restarts']} restarts "
        "in its life",
        "",
        "What happened (times UTC; +time since it was created):",
    ]
    start = (explanation.timeline[0].at if explanation.timeline else None) or now
    day = None
    for e in explanation.timeline:
        at = datetime.fromtimestamp(e.at or start, UTC)
        if at.date() != day:
            day = at.date()
            lines.append(f"  {day.isoformat()}")
        stamp = at.strftime("%H:%M:%S.") + f"{at.microsecond // 1000:03d}"
        offset = "+" + secs((e.at or start) - start)
        mark = "  ·" if e.kind in ("wait", "budget", "restart") else "  -"
        lines.append(f"{mark} {stamp} {offset:>8}  {literal(e.text)}")
    lines += ["", f"What happens next (now {datetime.fromtimestamp(now, UTC):%H:%M:%S} UTC):"]
    titles = {"due": "next", "next_error": "on error", "next_restart": "if stuck"}
    titles["deadline"] = "deadline"
    for e in explanation.forecast:
        lines.append(f"  {titles.get(e.kind, e.kind):>8}: {literal(e.text)}")
    return "\n".join(lines)
