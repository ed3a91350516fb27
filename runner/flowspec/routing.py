"""Routing by label in a flow file: a state's effective ``runs_on`` and
``routing_timeout``, and their checks.

A handler state's ``runs_on`` is ``defaults.runs_on`` with the state's own merged over it
(a value ``""`` removes a default's label); its ``routing_timeout`` is the state's, else
the defaults' (``None``: an instance waits for a matching worker for ever). The
requirement is resolved when an instance enters the state (``runner.labels.resolve``) and
kept by the claim (``runner.store.hot.claim_statement``); the timeout is acted on by
``runner.store.routing``.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.flowspec.loader import did_you_mean
from runner.flowspec.partial import Gaps
from runner.flowspec.spec import Defaults, FlowSpec, StateSpec
from runner.labels import FAILED, NO_ROUTING, Routing, needs_event

Report = Callable[..., None]
"""``err(message: str, loc: tuple, *, key: bool = False) -> None``."""


def state_routing(defaults: Defaults, st: StateSpec) -> Routing:
    """The effective routing of state ``st`` (:data:`NO_ROUTING` for a state with no
    handler or no requirement)."""
    if not (st.exec_ or st.call):
        return NO_ROUTING
    merged = {**(defaults.runs_on or {}), **(st.runs_on or {})}
    runs_on = {k: v for k, v in merged.items() if v != ""} or None
    if runs_on is None:
        return NO_ROUTING
    timeout = st.routing_timeout or defaults.routing_timeout
    if timeout is None:
        return Routing(runs_on)
    return Routing(runs_on, timeout.after, timeout.then)


def event_fields_named(spec: FlowSpec) -> list[str]:
    """The event fields every ``runs_on`` of the flow names (``{event.host}``): what an
    instance started by an event keeps of it (``instances.route_event``)."""
    out: list[str] = []
    for st in spec.states.values():
        for name in needs_event({**(spec.defaults.runs_on or {}), **(st.runs_on or {})}):
            if name not in out:
                out.append(name)
    return out


def check_routing(spec: FlowSpec, err: Report, gaps: Gaps) -> None:
    """``runs_on`` and ``routing_timeout`` on handler states only; a timeout's ``then`` is
    ``failed`` or a state of this flow."""
    names = list(spec.states)

    def then(value: str, loc: tuple[str | int, ...]) -> None:
        if value != FAILED and value not in spec.states and value not in gaps.states:
            err(
                f"routing_timeout's then '{value}' must be failed or a state of this flow"
                f"{did_you_mean(value, [FAILED, *names])}",
                loc,
            )

    if spec.defaults.routing_timeout is not None:
        then(spec.defaults.routing_timeout.then, ("defaults", "routing_timeout", "then"))
    for name, st in spec.states.items():
        for key in ("runs_on", "routing_timeout"):
            if getattr(st, key) is not None and not (st.exec_ or st.call):
                err(f"{key} applies to exec and call states only", ("states", name, key), key=True)
        if st.routing_timeout is not None:
            then(st.routing_timeout.then, ("states", name, "routing_timeout", "then"))


def routing_targets(spec: FlowSpec, st: StateSpec) -> list[str]:
    """The state a routing timeout of ``st`` moves to, if any (for reachability)."""
    routing = state_routing(spec.defaults, st)
    return [routing.then] if routing.after is not None and routing.then != FAILED else []
