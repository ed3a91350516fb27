"""Why an instance is where it is, and what happens next: ``flowrun explain`` as data.

:func:`explain` replays an instance's stored history (its attempt rows, its command rows,
the sensor event that started it) through the same fault model the worker applies
(``runner.engine.outcomes.decide``: the error budget's sliding window, the backoff, the
restarts), so each wait between two attempts gets its cause: the ``try_interval`` after a
"not yet", backoff *n* with the jitter range its delay was drawn from, a lost attempt's
lease expiry, a command or a requested sleep. The forecast applies the same rules to the
instance as it stands: when it is due and why, what the next error would do, what a
missed keepalive would do.

Pure: the rows come from ``runner.ops.detail.instance_rows`` and the compiled flows from
``runner.store.versions.compiled`` (passed in as ``flow_of``). Times are float epoch
seconds, UTC. Answers operators asking "why is this retrying / stuck" (temporal#6605,
temporalio/ui#884), who otherwise get raw event lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from runner import lifecycle
from runner.flowspec.policy import Backoff, Policy


@dataclass
class Entry:
    """One line of the timeline or the forecast.

    Attributes:
        at: epoch seconds (UTC) the entry is about (``None`` for a forecast without a time).
        kind: ``created``, ``attempt``, ``wait``, ``budget``, ``restart``, ``command``,
            ``rule``, ``version``, ``sleep``, ``running`` (timeline) or ``due``,
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
    """What :func:`explain` returns: the instance's summary, timeline and forecast."""

    instance: dict[str, Any]
    timeline: list[Entry]
    forecast: list[Entry]

    def as_json(self, iso: Callable[[float | None], str | None]) -> dict:
        """A JSON-ready dict; ``iso`` turns epoch seconds into text (``runner.ops.views.iso``)."""

        def entry(e: Entry) -> dict:
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
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for line in (text or "").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def backoff_range(backoff: Backoff, n: int) -> tuple[float, float, float]:
    """``(base, low, high)``: backoff ``n``'s base delay and the range its jittered delay is
    drawn from (seconds), exactly as ``Backoff.delay`` draws it."""
    base = min(backoff.max, backoff.initial * backoff.factor ** max(0, n - 1))
    if backoff.jitter == "full":
        return base, 0.0, base
    if backoff.jitter == "equal":
        return base, base / 2, base
    return base, base, base


def describe_backoff(backoff: Backoff, n: int) -> str:
    """``"backoff 2: 10s, full jitter: a delay drawn from 0s to 10s"``."""
    base, low, high = backoff_range(backoff, n)
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
class _Track:
    """What the replay knows at a point in time (mirrors the instance's counters)."""

    state: str
    version: str
    errors: list[float] = field(default_factory=list)
    restarts: int = 0
    wait_cause: str | None = None
    wait_from: float | None = None
    wait_data: dict[str, Any] = field(default_factory=dict)
    interrupts: list[str] = field(default_factory=list)


def explain(
    rows: dict, flow_of: Callable[[str], Any], now: float, *, window_entries: bool = True
) -> Explanation:
    """The timeline and forecast of one instance.

    Args:
        rows: ``runner.ops.detail.instance_rows`` of the instance.
        flow_of: ``version -> CompiledFlow`` (``versions.compiled``); may raise, then the
            policy of that version is unknown and the texts say so.
        now: epoch seconds, UTC.
        window_entries: emit "budget refilled" entries when errors leave the window.

    Returns an :class:`Explanation`; raises nothing for any stored history.
    """
    inst = rows["instance"]
    cmds = rows["commands"]
    migrations = [c for c in cmds if c["command"] == "migrate" and c["status"] == "applied"]
    first_version = (migrations[0]["args"].get("from") if migrations else None) or inst["version"]
    first_state = _first_state(rows, flow_of, first_version)
    t = _Track(state=first_state, version=first_version)
    out: list[Entry] = [_created(inst, rows.get("event"), first_state, first_version)]
    _wait(t, inst["created_at"], "created due at once", kind="created", high=0.0)

    def policy(state: str | None = None) -> Policy | None:
        try:
            return flow_of(t.version).states[state or t.state].policy
        except Exception:  # noqa: BLE001 - a version that no longer compiles: policy unknown
            return None

    def refill(upto: float) -> None:
        pol = policy()
        if pol is None or not t.errors:
            return
        while t.errors and t.errors[0] + pol.window <= upto:
            left_at = t.errors.pop(0) + pol.window
            if window_entries:
                out.append(
                    Entry(
                        left_at,
                        "budget",
                        f"budget refilled: an error left the {secs(pol.window)} window "
                        f"({len(t.errors)} of {pol.max_errors} errors now count)",
                        {"errors_in_window": len(t.errors), "max_errors": pol.max_errors},
                    )
                )

    stream: list[tuple[float, int, str, dict]] = []
    for a in rows["attempts"]:
        stream.append((a["started_at"] or 0.0, 1, "start", a))
        if a["outcome"] is not None:  # a chained attempt starts when the one before ends
            stream.append((a["finished_at"] or a["started_at"] or 0.0, 0, "end", a))
    for c in cmds:
        stream.append((c["created_at"], 2, "command", c))
    stream.sort(key=lambda s: (s[0], s[1]))
    for at, _, what, item in stream:
        refill(at)
        if what == "start":
            _close_wait(out, t, at, item)
            if item["outcome"] is None:
                out.append(_running(item, inst, now))
        elif what == "end":
            _ended(out, t, item, policy(item["state"]), flow_of)
        else:
            _command(out, t, item, flow_of)
    refill(now)
    out.sort(key=lambda e: e.at or 0.0)  # stable: same-time entries keep their order
    return Explanation(
        instance=_summary(inst),
        timeline=out,
        forecast=forecast(inst, _safe_flow(flow_of, inst["version"]), now, t),
    )


def _safe_flow(flow_of: Callable[[str], Any], version: str) -> Any:
    try:
        return flow_of(version)
    except Exception:  # noqa: BLE001 - unknown policy: said in the forecast
        return None


def _first_state(rows: dict, flow_of, version: str) -> str:
    atts = rows["attempts"]
    if atts:
        return atts[0]["state"]
    flow = _safe_flow(flow_of, version)
    return flow.initial if flow is not None else rows["instance"]["state"]


def _summary(inst: dict) -> dict:
    keys = ("id", "flow", "version", "state", "status", "due_at", "attempts", "errors")
    return {k: inst[k] for k in (*keys, "restarts", "state_restarts", "running_attempt")}


def _created(inst: dict, event: dict | None, state: str, version: str) -> Entry:
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


def _running(a: dict, inst: dict, now: float) -> Entry:
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


def _close_wait(out: list[Entry], t: _Track, at: float, a: dict) -> None:
    if t.wait_from is None:
        return
    waited = at - t.wait_from
    if waited < 0.05 and t.wait_data.get("cause", {}).get("kind") in ("moved", "created"):
        t.wait_from, t.wait_cause, t.wait_data, t.interrupts = None, None, {}, []
        return  # started at once (a chained move): no wait to explain
    text = f"waited {secs(waited)} before attempt {a['attempt']}: {t.wait_cause}"
    expected = t.wait_data.get("cause", {}).get("high")
    if expected is not None and waited > expected + 1.0 and not t.interrupts:
        text += f"; the last {secs(waited - expected)} for a free worker (none was idle)"
    if t.interrupts:
        text += f"; meanwhile: {', '.join(t.interrupts)}"
    out.append(Entry(t.wait_from, "wait", text, {"waited": round(waited, 6), **t.wait_data}))
    t.wait_from, t.wait_cause, t.wait_data, t.interrupts = None, None, {}, []


def _wait(t: _Track, at: float, cause: str, **data: Any) -> None:
    t.wait_from, t.wait_cause, t.wait_data, t.interrupts = at, cause, {"cause": data}, []


def _enter(t: _Track, state: str) -> None:
    t.state, t.errors, t.restarts = state, [], 0


def _ended(out: list[Entry], t: _Track, a: dict, pol: Policy | None, flow_of) -> None:
    at = a["finished_at"] or a["started_at"]
    took = secs(at - a["started_at"]) if a["started_at"] is not None else "?"
    outcome, head = a["outcome"], f"attempt {a['attempt']} in {a['state']!r} on {a['worker']}"
    data = {"attempt": a["attempt"], "state": a["state"], "worker": a["worker"]}
    data.update(outcome=outcome, started_at=a["started_at"], duration=at - a["started_at"])
    error = first_line(a["error"])
    if outcome == "moved":
        flow = _safe_flow(flow_of, t.version)
        target = a["to_state"]
        kind = flow.states[target].kind if flow is not None and target in flow.states else None
        out.append(
            Entry(a["started_at"], "attempt", f"{head}: took {took}, moved to {target!r}", data)
        )
        _enter(t, target)
        if kind == "terminal":
            out.append(Entry(at, "attempt", f"completed: {target!r} is a terminal state", {}))
        elif kind == "external":
            on = flow.states[target].on
            events = ", ".join(f"{e} → {s}" for e, s in on.items()) or "none"
            _wait(
                t,
                at,
                f"state {target!r} has no handler; it waits for an event ({events})",
                kind="external",
            )
        else:
            _wait(t, at, f"entered {target!r}, due at once", kind="moved", high=0.0)
        return
    if outcome == "not_yet":
        out.append(
            Entry(a["started_at"], "attempt", f"{head}: took {took}, not yet (nothing spent)", data)
        )
        interval = f"try_interval {secs(pol.try_interval)}" if pol else "the try_interval"
        _wait(
            t,
            at,
            f"{interval} after the handler said not yet",
            kind="try_interval",
            high=pol.try_interval if pol else None,
        )
        return
    if outcome == "sleep":
        out.append(
            Entry(a["started_at"], "attempt", f"{head}: took {took}, asked to {error}", data)
        )
        _wait(t, at, f"the handler asked to {error} (nothing spent)", kind="sleep")
        return
    if outcome == "error":
        out.append(Entry(a["started_at"], "attempt", f"{head}: took {took}, error: {error}", data))
        _spend(out, t, at, pol, flow_of)
        return
    if outcome in ("timeout", "lost"):
        if outcome == "timeout":
            text = f"{head}: took {took}, stopped: {error}"
        else:
            text = (
                f"{head}: lost after {took}: its worker stopped renewing the lease, and the "
                f"attempt was recorded lost when the lease expired"
            )
        out.append(Entry(a["started_at"], "attempt", text, data))
        t.restarts += 1
        limit = pol.max_restarts if pol else None
        if limit is not None and t.restarts > limit:
            out.append(
                Entry(
                    at,
                    "restart",
                    f"restarts spent ({t.restarts} > max_restarts {limit}): failed",
                    {},
                )
            )
            return
        of = f" of {limit}" if limit is not None else ""
        out.append(
            Entry(
                at,
                "restart",
                f"restart {t.restarts}{of} (no error budget spent): runs again at once "
                "from the last checkpoint",
                {"restarts": t.restarts, "max_restarts": limit},
            )
        )
        cause = (
            "lease expiry of the lost attempt, then a restart" if outcome == "lost" else "a restart"
        )
        _wait(t, at, cause, kind=outcome, high=0.0)
        return
    if outcome == "cancelled":
        out.append(
            Entry(
                a["started_at"],
                "attempt",
                f"{head}: cancelled after {took} ({error or 'taken away'}): nothing spent",
                data,
            )
        )
        _wait(
            t, at, "the attempt was cancelled (a command, or its worker stopping)", kind="cancelled"
        )
        return
    out.append(Entry(a["started_at"], "attempt", f"{head}: {outcome}", data))


def _spend(out: list[Entry], t: _Track, at: float, pol: Policy | None, flow_of) -> None:
    if pol is None:
        out.append(
            Entry(
                at,
                "budget",
                "error counted (policy unknown: its flow version no longer compiles)",
                {},
            )
        )
        return
    t.errors = [e for e in lifecycle.in_window(t.errors, at, pol.window)] + [at]
    n = len(t.errors)
    if n < pol.max_errors:
        base, low, high = backoff_range(pol.backoff, n)
        out.append(
            Entry(
                at,
                "budget",
                f"error {n} of {pol.max_errors} allowed in {secs(pol.window)}: "
                f"{pol.max_errors - n} left before on_exhausted",
                {"errors_in_window": n, "max_errors": pol.max_errors, "window": pol.window},
            )
        )
        _wait(
            t,
            at,
            describe_backoff(pol.backoff, n),
            kind="backoff",
            n=n,
            base=base,
            low=low,
            high=high,
            jitter=pol.backoff.jitter,
        )
        return
    out.append(
        Entry(
            at,
            "budget",
            f"error {n} of {pol.max_errors} in {secs(pol.window)}: the error budget is spent; "
            f"{exhausted_target(pol)}",
            {"errors_in_window": n, "max_errors": pol.max_errors, "on_exhausted": pol.on_exhausted},
        )
    )
    if pol.on_exhausted not in ("failed", "paused"):
        _enter(t, pol.on_exhausted)
        _wait(
            t, at, f"entered {pol.on_exhausted!r} (on_exhausted), due at once", kind="on_exhausted"
        )


def _command(out: list[Entry], t: _Track, c: dict, flow_of) -> None:
    source = c["source"] or "cli"
    who = f"rule {source[5:]}" if source.startswith("rule:") else source
    kind = "rule" if source.startswith("rule:") else "command"
    name = c["command"]
    args = c["args"] or {}
    if args.get("event_id") is not None:
        who += f" on event #{args['event_id']}"
    data = {"command": name, "source": source, "status": c["status"], "args": args}
    if c["status"] != "applied":
        out.append(Entry(c["created_at"], kind, f"{name} by {who}: refused ({c['result']})", data))
        return
    text = f"{name} by {who}: {c['result']}"
    if name == "migrate":
        kind = "version"
        t.version = args.get("to") or t.version
        if args.get("state") and args["state"] != t.state:
            _enter(t, args["state"])
    elif name == "send":
        flow = _safe_flow(flow_of, t.version)
        try:
            target = flow.event_target(t.state, args.get("event")) if flow else None
        except Exception:  # noqa: BLE001 - history written under another definition
            target = None
        if target:
            _enter(t, target)
    elif name == "retry":
        t.errors, t.restarts = [], 0
        text += " (error budget and restarts of the state start afresh)"
    elif name == "sleep":
        kind = "sleep"
    out.append(Entry(c["created_at"], kind, text, data))
    if t.wait_from is not None:
        t.interrupts.append(f"{name} by {who}")
    if name in ("resume", "retry", "send", "wake", "migrate"):
        _wait(t, c["created_at"], f"{name} by {who}", kind="command", command=name)
    elif name == "sleep":
        _wait(t, c["created_at"], f"put to sleep by {who} (nothing spent)", kind="sleep")


def forecast(inst: dict, flow: Any, now: float, t: _Track | None = None) -> list[Entry]:
    """What happens next to ``inst`` (an ``instances`` row as a dict) under ``flow`` (its
    ``CompiledFlow``, or ``None`` when its version no longer compiles) at ``now``.

    Returns entries ``due`` (when and why), ``next_error`` (the backoff range, the budget
    left, ``on_exhausted``'s target) and ``next_restart`` (what a timeout, a missed
    keepalive or a lost attempt would do: restarts left).
    """
    out = [_due(inst, flow, now, t)]
    st = flow.states.get(inst["state"]) if flow is not None else None
    if (
        st is None
        or st.kind in ("terminal", "external")
        or inst["status"] in ("completed", "killed")
    ):
        return out
    pol = st.policy
    after = ""
    if inst["status"] == "failed":  # a retry starts the state's counters afresh
        inst = {**inst, "state_errors": [], "state_restarts": 0}
        after = "after a retry, "
    errs = lifecycle.in_window(inst["state_errors"], now, pol.window)
    n = len(errs) + 1
    if n < pol.max_errors:
        base, low, high = backoff_range(pol.backoff, n)
        text = (
            f"{after}the next error would be error {n} of {pol.max_errors} in {secs(pol.window)}: "
            f"{describe_backoff(pol.backoff, n)}; {pol.max_errors - n} more before on_exhausted "
            f"({exhausted_target(pol)})"
        )
        data = {"n": n, "base": base, "low": low, "high": high, "left": pol.max_errors - len(errs)}
    else:
        text = (
            f"{after}the next error would be error {n} of {pol.max_errors} in {secs(pol.window)}: "
            f"the budget would be spent, so {exhausted_target(pol)}"
        )
        data = {"n": n, "left": pol.max_errors - len(errs), "on_exhausted": pol.on_exhausted}
    if errs:
        text += (
            f"; the oldest counted error leaves the window in {secs(errs[0] + pol.window - now)}"
        )
        data["refill_at"] = errs[0] + pol.window
    out.append(Entry(None, "next_error", text, data))
    used = inst["state_restarts"]
    limits = [f"timeout {secs(pol.timeout)}" if pol.timeout else "no timeout"]
    limits.append(f"keepalive {secs(pol.keepalive)}" if pol.keepalive else "no keepalive")
    if used + 1 > pol.max_restarts:
        then = f"restarts are spent ({used} of {pol.max_restarts}): the instance would fail"
    else:
        then = (
            f"restart {used + 1} of {pol.max_restarts}: it runs again at once from its last "
            f"checkpoint, no error budget spent ({pol.max_restarts - used - 1} restarts left after)"
        )
    out.append(
        Entry(
            None,
            "next_restart",
            f"{after}a missed keepalive, a timeout or a lost attempt ({', '.join(limits)}) "
            f"would be {then}",
            {
                "restarts": used,
                "max_restarts": pol.max_restarts,
                "timeout": pol.timeout,
                "keepalive": pol.keepalive,
            },
        )
    )
    return out


def _due(inst: dict, flow: Any, now: float, t: _Track | None) -> Entry:
    iid, status, due = inst["id"], inst["status"], inst["due_at"]
    why = t.wait_cause if t is not None and t.wait_cause else None
    data: dict[str, Any] = {"status": status, "due_at": due, "why": why}
    st = flow.states.get(inst["state"]) if flow is not None else None
    if inst.get("running_attempt") is not None:
        text = (
            f"attempt {inst['running_attempt']} is running on {inst['locked_by']}; its "
            "outcome decides what is next"
        )
    elif status == "completed":
        text = f"nothing: completed in terminal state {inst['state']!r}"
    elif status == "killed":
        text = "nothing: killed by a command"
    elif status == "failed":
        text = (
            f"nothing until an operator acts: failed ({first_line(inst['last_error'])}); "
            f"`flowrun retry {iid}` runs {inst['state']!r} again with a fresh error budget"
        )
    elif status == "paused":
        text = f"nothing until `flowrun resume {iid}`: paused (then due at once)"
        if inst.get("last_error") and inst["last_error"].startswith("error budget spent"):
            why_paused = first_line(inst["last_error"])
            text = f"nothing until `flowrun resume {iid}`: paused because {why_paused}"
    elif due is None and st is not None and st.kind == "external":
        events = ", ".join(f"`flowrun send {iid} {e}` (→ {s})" for e, s in st.on.items())
        text = f"waits in {inst['state']!r} for an event: {events or 'none accepted'}"
    elif due is None:
        text = "not scheduled"
    elif due <= now:
        text = f"due now (since {secs(now - due)}): the next free worker claims it"
        if why:
            text += f"; it waited for: {why}"
    else:
        word = "sleeping" if status == "sleeping" else "due"
        text = f"{word} until {_clock(due)} (in {secs(due - now)})"
        if why:
            text += f": {why}"
    return Entry(due, "due", text, data)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_text(explanation: Explanation, now: float) -> str:
    """The text of ``explanation`` (a ``runner.ops.explain.Explanation``) at ``now``
    (epoch seconds): what ``flowrun explain`` prints and the console shows. A header,
    the timeline (UTC clock time and seconds since the instance
    was created), and what happens next."""
    inst = explanation.instance
    lines = [
        f"instance {inst['id']} of flow {inst['flow']}: state {inst['state']!r}, "
        f"status {inst['status']} (flow version {inst['version']})",
        f"{inst['attempts']} attempts, {inst['errors']} errors, {inst['restarts']} restarts "
        "in its life",
        "",
        "What happened (times UTC; +time since it was created):",
    ]
    start = explanation.timeline[0].at if explanation.timeline else now
    day = None
    for e in explanation.timeline:
        at = datetime.fromtimestamp(e.at or start, UTC)
        if at.date() != day:
            day = at.date()
            lines.append(f"  {day.isoformat()}")
        stamp = at.strftime("%H:%M:%S.") + f"{at.microsecond // 1000:03d}"
        offset = "+" + secs((e.at or start) - start)
        mark = "  ·" if e.kind in ("wait", "budget", "restart") else "  -"
        lines.append(f"{mark} {stamp} {offset:>8}  {e.text}")
    lines += ["", f"What happens next (now {datetime.fromtimestamp(now, UTC):%H:%M:%S} UTC):"]
    titles = {"due": "next", "next_error": "on error", "next_restart": "if stuck"}
    for e in explanation.forecast:
        lines.append(f"  {titles.get(e.kind, e.kind):>8}: {e.text}")
    return "\n".join(lines)
