"""Why an instance is where it is, and what happens next: ``flowrun explain`` as data.

:func:`explain` replays an instance's stored history (its attempt rows, its command rows,
the sensor event that started it) through the fault model the worker applies
(``runner.flowspec.faults``, called by both: the error budget's sliding window, the
backoff, the restarts), so each wait between two attempts gets its cause: the
``try_interval`` after a "not yet", backoff *n* with the jitter range its delay was drawn
from, a lost attempt's lease expiry, a command or a requested sleep. The forecast applies
the same rules to the instance as it stands: when it is due and why, what the next error
would do, what a missed keepalive would do.

The forecast is ``runner.ops.forecast``; the values and the text
``runner.ops.explanation``. Pure: the rows come from ``runner.ops.detail.instance_rows``
and the compiled flows from ``runner.ops.detail.stored_flow`` or
``runner.store.versions.compiled`` (passed in as ``flow_of``). Times are float epoch
seconds, UTC. Answers operators asking "why is this retrying / stuck" (temporal#6605,
temporalio/ui#884), who otherwise get raw event lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner import lifecycle
from runner.error_line import error_line
from runner.flowspec import faults
from runner.flowspec.policy import Policy
from runner.ops.explanation import (
    Entry,
    Explanation,
    Track,
    clock,
    created_entry,
    deadline_entry,
    describe_backoff,
    exhausted_target,
    pruned_entry,
    running_entry,
    secs,
)
from runner.ops.forecast import forecast
from runner.ops.views import waits_for


def explain(
    rows: dict[str, Any], flow_of: Callable[[str], Any], now: float, *, window_entries: bool = True
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
    t = Track(state=first_state, version=first_version)
    out: list[Entry] = [created_entry(inst, rows.get("event"), first_state, first_version)]
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
        while t.errors and t.errors[0] <= upto - pol.window:  # as lifecycle.in_window
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

    stream: list[tuple[float, float, str, dict[str, Any]]] = []
    for a in rows["attempts"]:
        stream.append((a["started_at"] or 0.0, 1, "start", a))
        if a["outcome"] is not None:  # a chained attempt starts when the one before ends
            stream.append((*_end_at(a, cmds), "end", a))
    for c in cmds:
        stream.append((c["created_at"], 2, "command", c))
    # at one time: by order, then an attempt's start before its own end
    stream.sort(key=lambda s: (s[0], s[1], s[3].get("attempt") or 0, s[2] == "end"))
    for at, _, what, item in stream:
        refill(at)
        if what == "start":
            t.status = "runnable"  # claimed (a sleeping instance is woken by its claim)
            _close_wait(out, t, at, item)
            if item["outcome"] is None:
                out.append(running_entry(item, inst, now))
        elif what == "end":
            _ended(out, t, item, policy(item["state"]), flow_of)
        else:
            _command(out, t, item, flow_of)
    refill(now)
    if inst.get("history_from") is not None:
        out.append(pruned_entry(inst["history_from"]))
    out.sort(key=lambda e: e.at or 0.0)  # stable: same-time entries keep their order
    flow = _safe_flow(flow_of, inst["version"])
    summary = _summary(inst)
    events = waits_for(inst, flow)
    summary["waits_for"] = None if events is None else list(events)
    ahead = forecast(inst, flow, now, t)
    pending = deadline_entry(inst, flow, now)
    return Explanation(
        instance=summary, timeline=out, forecast=ahead + ([pending] if pending else []), track=t
    )


def _end_at(a: dict[str, Any], cmds: list[dict[str, Any]]) -> tuple[float, float]:
    """Where attempt ``a``'s end goes in the replay: ``(time, order)``, order 0 sorting
    before a start (1) and a command (2) at the same time (an attempt that took no time:
    1, right after its own start).

    An attempt ends when it finished, except one ``cancelled`` while an applied command
    came in (a pause, kill, sleep or send bumps the fence): its worker records the
    cancellation only when it notices the command (up to its poll interval later), but
    it was the command's doing, so it ends just before that command (order 1.5), and
    what the instance waits for after it is the command's cause, not "cancelled".
    """
    end = a["finished_at"] or a["started_at"] or 0.0
    start = a["started_at"]
    if a["outcome"] == "cancelled" and start is not None:
        during = [
            c["created_at"]
            for c in cmds
            if c["status"] == "applied" and start <= c["created_at"] <= end
        ]
        if during:
            return min(during), 1.5
    return end, 0 if start is None or end > start else 1  # one that took no time: after its start


def _safe_flow(flow_of: Callable[[str], Any], version: str) -> Any:
    try:
        return flow_of(version)
    except Exception:  # noqa: BLE001 - unknown policy: said in the forecast
        return None


def _first_state(rows: dict[str, Any], flow_of, version: str) -> str:
    atts = rows["attempts"]
    if atts:
        return atts[0]["state"]
    flow = _safe_flow(flow_of, version)
    return flow.initial if flow is not None else rows["instance"]["state"]


def _summary(inst: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "flow", "label", "version", "state", "status", "due_at", "attempts", "errors")
    return {k: inst.get(k) for k in (*keys, "restarts", "state_restarts", "running_attempt")}


def _close_wait(out: list[Entry], t: Track, at: float, a: dict[str, Any]) -> None:
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


def _wait(t: Track, at: float, cause: str, **data: Any) -> None:
    t.wait_from, t.wait_cause, t.wait_data, t.interrupts = at, cause, {"cause": data}, []


def _enter(t: Track, state: str, flow: Any = None) -> None:
    """Enter ``state``: its counters start afresh (``lifecycle.enter_state``); with the
    ``flow`` known, the status follows the state's kind."""
    t.state, t.errors, t.restarts = state, [], 0
    if flow is not None and state in flow.states:
        t.status = "completed" if flow.states[state].kind == "terminal" else "runnable"


def _ended(out: list[Entry], t: Track, a: dict[str, Any], pol: Policy | None, flow_of) -> None:
    at = a["finished_at"] or a["started_at"]
    took = secs(at - a["started_at"]) if a["started_at"] is not None else "?"
    outcome, head = a["outcome"], f"attempt {a['attempt']} in {a['state']!r} on {a['worker']}"
    data = {"attempt": a["attempt"], "state": a["state"], "worker": a["worker"]}
    data.update(outcome=outcome, started_at=a["started_at"], duration=at - a["started_at"])
    error = error_line(a["error"], 160)
    if outcome == "moved":
        flow = _safe_flow(flow_of, t.version)
        target = a["to_state"]
        kind = flow.states[target].kind if flow is not None and target in flow.states else None
        out.append(
            Entry(a["started_at"], "attempt", f"{head}: took {took}, moved to {target!r}", data)
        )
        _enter(t, target, flow)
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
        t.status = "runnable"
        due = faults.not_yet(pol, t.errors, t.restarts, at).due_at if pol else None
        wait = None if due is None else due - at
        interval = f"try_interval {secs(wait)}" if wait is not None else "the try_interval"
        _wait(t, at, f"{interval} after the handler said not yet", kind="try_interval", high=wait)
        return
    if outcome == "sleep":
        out.append(
            Entry(a["started_at"], "attempt", f"{head}: took {took}, asked to {error}", data)
        )
        t.status = "sleeping"  # until the time it asked for (one already past: runnable)
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
        limit = pol.max_restarts if pol else None
        if pol is None:  # policy unknown: a restart, never spent, as far as we can tell
            t.restarts += 1
        else:
            verdict = faults.restart(pol, t.errors, t.restarts, at, error, t.status)
            t.restarts, t.status = verdict.state_restarts, verdict.status
            if verdict.spent is not None:
                out.append(Entry(at, "restart", f"{verdict.spent}: {verdict.status}", {}))
                return
        of = f" of {limit}" if limit is not None else ""
        then = "runs again at once from the last checkpoint"
        if t.status != "runnable":  # a command put it to sleep first: it stays so
            then = f"the instance stays {t.status} (a command came first)"
        out.append(
            Entry(
                at,
                "restart",
                f"restart {t.restarts}{of} (no error budget spent): {then}",
                {"restarts": t.restarts, "max_restarts": limit},
            )
        )
        if t.status != "runnable":
            return
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


def _spend(out: list[Entry], t: Track, at: float, pol: Policy | None, flow_of) -> None:
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
    verdict = faults.error(pol, t.errors, t.restarts, at, None)
    t.errors, t.status = verdict.state_errors, verdict.status
    n = len(t.errors)
    if verdict.backoff is not None:
        base, low, high = pol.backoff.bounds(n)
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
    if verdict.enter is not None:
        _enter(t, verdict.enter, _safe_flow(flow_of, t.version))
        _wait(t, at, f"entered {verdict.enter!r} (on_exhausted), due at once", kind="on_exhausted")


def _command(out: list[Entry], t: Track, c: dict[str, Any], flow_of) -> None:
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
    if name in lifecycle.OPERATOR_COMMANDS and lifecycle.allowed(t.status, name):
        t.status = lifecycle.check(t.status, name)
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
            was = t.status
            _enter(t, target, flow)
            if was == "paused" and t.status == "runnable":
                t.status = "paused"  # a paused instance moves but stays paused
    elif name == "route":  # routing_timeout (``runner.store.routing``)
        kind = "routing"
        if args.get("state") == "failed":
            t.status = "failed"
        elif args.get("state"):
            _enter(t, args["state"], _safe_flow(flow_of, t.version))
    elif name == "retry":
        t.errors, t.restarts = [], 0
        text += " (error budget and restarts of the state start afresh)"
    elif name == "sleep":
        kind = "sleep"
    elif name == "deadline":
        kind = "deadline"
        text = f"deadline missed at {clock(args.get('due') or c['created_at'])}: {c['result']}"
        if args.get("to"):
            _enter(t, args["to"], _safe_flow(flow_of, t.version))
        if args.get("status"):
            t.status = args["status"]
    out.append(Entry(c["created_at"], kind, text, data))
    if t.wait_from is not None:
        t.interrupts.append(f"{name} by {who}")
    if name in ("resume", "retry", "send", "wake", "migrate") or (
        name == "deadline" and args.get("to")
    ):
        _wait(t, c["created_at"], f"{name} by {who}", kind="command", command=name)
    elif name == "sleep":
        _wait(t, c["created_at"], f"put to sleep by {who} (nothing spent)", kind="sleep")
