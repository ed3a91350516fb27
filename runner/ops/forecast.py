"""What happens next to an instance, the forecast of ``flowrun explain``: when it is due
and why, what the next error would do (the backoff range, the budget left,
``on_exhausted``) and what a timeout, a missed keepalive or a lost attempt would do.

Pure: asks the fault model the worker applies (``runner.flowspec.faults``) what the next
error and the next restart would do to the instance as it stands. Times are float epoch
seconds, UTC.
"""

from __future__ import annotations

from typing import Any

from runner.error_line import error_line
from runner.flowspec import faults
from runner.labels import show
from runner.ops.explanation import (
    Entry,
    Track,
    clock,
    describe_backoff,
    exhausted_target,
    secs,
)
from runner.store.limit_names import describe, is_limit


def forecast(inst: dict[str, Any], flow: Any, now: float, t: Track | None = None) -> list[Entry]:
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
    verdict = faults.error(pol, inst["state_errors"], inst["state_restarts"], now, None)
    errs = verdict.state_errors[:-1]  # those counted before the next error
    n = len(verdict.state_errors)
    if verdict.backoff is not None:
        base, low, high = pol.backoff.bounds(n)
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
    restart = faults.restart(pol, [], used, now, None)
    if restart.spent is not None:
        then = f"{restart.spent}: the instance would fail"
    else:
        then = (
            f"restart {restart.state_restarts} of {pol.max_restarts}: it runs again at once "
            f"from its last checkpoint, no error budget spent "
            f"({pol.max_restarts - restart.state_restarts} restarts left after)"
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


def pool_wait(name: str, pool: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    """The forecast text of an instance waiting for a slot of pool ``name``, from the
    pool as ``runner.ops.pools.read_pools`` gives it (``None``: unknown), and that dict."""
    if is_limit(name):  # a flow's max_running
        what = describe(name)
        if pool is None:
            return f"waiting for {what}: due again when one of its attempts ends", None
        holders = ", ".join(str(i) for i in pool["holders"]) or "none"
        return (
            f"waiting for {what}: {pool['in_use']}/{pool['slots']} running: {holders}; "
            f"due again when one ends ({pool['waiting']} waiting)",
            pool,
        )
    if pool is None:
        return f"waiting for pool {name}: due again when a slot frees", None
    holders = ", ".join(str(i) for i in pool["holders"]) or "none"
    return (
        f"waiting for pool {name}: {pool['in_use']}/{pool['slots']} in use by {holders}; "
        f"due again when a slot frees ({pool['waiting']} waiting)",
        pool,
    )


def route_wait(inst: dict[str, Any], st: Any, now: float) -> str:
    """``waiting for a worker with gpu=1: none alive since 03:12`` (and when its
    ``routing_timeout`` moves it), or ``…: 2 alive`` when it is only queued; ``inst`` has
    ``runs_on`` and ``route_now`` (``runner.ops.detail``: ``alive``, ``last``)."""
    route = inst["route_now"]
    who = f"a worker with {show(inst['runs_on'])}"
    if route["alive"]:
        return f"waiting for {who}: {route['alive']} alive (queued; the next free one claims it)"
    last = route["last"]
    since = f"none alive since {clock(last)}" if last is not None else "none ever seen"
    text = f"waiting for {who}: {since}"
    routing = getattr(st, "routing", None)
    if routing is not None and routing.after is not None:
        at = max(inst["due_at"] or now, last or 0.0) + routing.after
        then = routing.then
        text += (
            f"; routing_timeout moves it to {then} at {clock(at)} (in {secs(max(0.0, at - now))})"
        )
    return text


def _rank(inst: dict[str, Any]) -> str:
    """``"; priority 9 (flowrun start): ..."`` for an instance whose priority is not the
    default 5, else ``""`` (in a queue the higher priority goes first, then the earliest
    due)."""
    p = inst.get("priority")
    if p is None or p == 5:
        return ""
    given = " (flowrun start --priority)" if inst.get("start_priority") is not None else ""
    return f"; priority {p}{given}: before lower priorities, after higher ones"


def _standby(inst: dict[str, Any], st: Any) -> bool:
    """A claimed instance of a pooled state holding no slot: a standby
    (``runner.engine.seats``), started in a slot its daemon hands on."""
    return st is not None and getattr(st, "pool", None) is not None and inst.get("pool") is None


def _due(inst: dict[str, Any], flow: Any, now: float, t: Track | None) -> Entry:
    iid, status, due = inst["id"], inst["status"], inst["due_at"]
    why = t.wait_cause if t is not None and t.wait_cause else None
    data: dict[str, Any] = {"status": status, "due_at": due, "why": why}
    st = flow.states.get(inst["state"]) if flow is not None else None
    if inst.get("running_attempt") is not None and st is not None and _standby(inst, st):
        text = (
            f"claimed by {inst['locked_by']} as a standby of pool {st.pool}: it starts in the "
            "slot of one of that daemon's attempts in the pool as that attempt ends, or is "
            "given back within a second"
        )
    elif inst.get("running_attempt") is not None:
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
            f"nothing until an operator acts: failed ({error_line(inst['last_error'], 160)}); "
            f"`flowrun retry {iid}` runs {inst['state']!r} again with a fresh error budget"
        )
    elif status == "paused":
        text = f"nothing until `flowrun resume {iid}`: paused (then due at once)"
        if inst.get("last_error") and inst["last_error"].startswith("error budget spent"):
            why_paused = error_line(inst["last_error"], 160)
            text = (
                f"nothing until `flowrun resume {iid}`: paused because its error budget was "
                f"spent (last: {why_paused})"
            )
    elif due is None and st is not None and st.kind == "external":
        events = ", ".join(f"`flowrun send {iid} {e}` (→ {s})" for e, s in st.on.items())
        text = f"waits in {inst['state']!r} for an event: {events or 'none accepted'}"
    elif due is None and inst.get("waiting_for"):
        text, data["pool"] = pool_wait(inst["waiting_for"], inst.get("pool_now"))
        text += _rank(inst)
    elif due is None:
        text = "not scheduled"
    elif due <= now and inst.get("route_now") is not None:
        text = route_wait(inst, st, now)
        text += _rank(inst)
    elif due <= now:
        text = f"due now (since {secs(now - due)}): the next free worker claims it"
        if why:
            text += f"; it waited for: {why}"
        text += _rank(inst)
    elif (inst.get("waiting_for") or "").startswith("rate "):
        text = f"{inst['waiting_for']} reached, next start {clock(due)} (in {secs(due - now)})"
    else:
        word = "sleeping" if status == "sleeping" else "due"
        text = f"{word} until {clock(due)} (in {secs(due - now)})"
        if why:
            text += f": {why}"
    return Entry(due, "due", text, data)
