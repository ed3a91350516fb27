"""Graph-level checks of a flow file, beyond what each field's own validation sees.

Every target (``initial``, ``next``, ``to``, ``on:``) names a state of the flow; each state
is exactly one of handler / external / terminal and can be left (unless terminal); every
state is reachable from ``initial`` (over ``next``/``to``/``on:`` and a handler state's
``on_exhausted``); ``on_exhausted`` is ``failed``, ``paused`` or a state; a rule names a
sensor of its flow, and a ``send`` aimed at this flow names an event some state accepts;
every event field a rule uses (``match`` keys, ``{event.x}`` in ``data`` templates and in
selector regexes) is a field the rule's sensor kind emits (``spec.event_fields``); the keys
that set up a handler's process are on handler states only, those of an ``exec`` process
(``PROCESS_KEYS``) on ``exec`` states only.
Messages are clear text with a "did you mean" hint; the caller turns each ``loc`` (a key
path in the YAML) into a position.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from runner.flowspec.deadlines import THEN_OUTCOMES
from runner.flowspec.loader import did_you_mean
from runner.flowspec.partial import Gaps
from runner.flowspec.policy import STATUS_OUTCOMES
from runner.flowspec.routing import check_routing, routing_targets
from runner.flowspec.spec import DeadlineSpec, FlowSpec, StateSpec
from runner.flowspec.spec_rules import DELIVERED, delivery_templates
from runner.flowspec.spec_sensors import event_fields
from runner.templating import event_refs, placeholders

Report = Callable[..., None]
"""``err(message: str, loc: tuple, *, key: bool = False) -> None``."""

NO_GAPS = Gaps()
"""A flow with nothing left out: every check runs."""


def check_flow(spec: FlowSpec, err: Report, gaps: Gaps = NO_GAPS) -> None:
    """Run the graph-level checks on a validated ``spec``, reporting through ``err``.

    Args:
        spec: the flow file, already validated field by field (``load_flow_partial``).
        err: called as ``err(message: str, loc: tuple, key=False)`` once per problem;
            ``loc`` is the key path in the YAML (e.g. ``("states", "a", "next")``) and
            ``key=True`` points at the key rather than its value.
        gaps: what the file's field errors left out of ``spec``
            (``runner.flowspec.partial.Gaps``): a name of a left-out state or sensor is
            not reported as unknown, and with ``gaps.edges`` neither reachability nor
            the events a ``send`` names are checked.

    Raises nothing itself: every problem goes to ``err`` (which may raise to stop early).
    """
    _check_states(spec, err, gaps)
    if not gaps.edges:
        _check_reachable(spec, err)
    _check_exhausted(spec, err, gaps)
    _check_deadlines(spec, err, gaps)
    _check_process_keys(spec, err)
    _check_rules(spec, err, gaps)
    _check_event_fields(spec, err)
    _check_pools(spec, err)
    check_routing(spec, err, gaps)


def _check_pools(spec: FlowSpec, err: Report) -> None:
    """``slots`` needs ``pool``, and asks no more slots than this file's pool has (a pool
    declared in another file is checked against it by ``FlowRegistry``); ``on_limit``
    needs ``max_running``."""
    if "on_limit" in spec.model_fields_set and spec.max_running is None:
        err("on_limit needs max_running: the limit of what?", ("on_limit",), key=True)
    for name, st in spec.states.items():
        if st.slots is not None and st.pool is None:
            err("slots needs pool: the slots of which pool?", ("states", name, "slots"), key=True)
        declared = spec.pools.get(st.pool) if st.pool else None
        size = declared.slots if declared is not None else None
        if size is not None and (st.slots or 1) > size:
            err(
                f"state '{name}' takes {st.slots} slots of pool '{st.pool}', which has {size}",
                ("states", name, "slots"),
            )


#: State keys that set up an ``exec`` handler's own process: a ``call`` handler runs in
#: the daemon's process, where none of them can apply.
PROCESS_KEYS = ("env_inherit", "working_dir", "limits", "user", "group")

#: State keys of any handler (a ``call`` handler gets them as ``ctx.env``/``ctx.secrets``).
HANDLER_KEYS = ("env", "secrets", "pool", "slots", "rate")


def _check_process_keys(spec: FlowSpec, err: Report) -> None:
    """Process keys on ``exec`` states only; handler keys on handler states only."""
    for name, st in spec.states.items():
        given = st.model_fields_set
        handler = st.exec_ is not None or st.call is not None
        for key in (*HANDLER_KEYS, *PROCESS_KEYS):
            if key not in given or getattr(st, key) is None:
                continue
            if not handler:
                err(
                    f"{key} needs a handler (exec or call): this state has none",
                    ("states", name, key),
                    key=True,
                )
            elif st.exec_ is None and key in PROCESS_KEYS:
                err(
                    f"{key} applies to exec handlers only: a call handler runs in the "
                    "daemon's own process",
                    ("states", name, key),
                    key=True,
                )


def _target(
    spec: FlowSpec,
    err: Report,
    value: str,
    loc: tuple[str | int, ...],
    what: str,
    gaps: Gaps = NO_GAPS,
) -> None:
    """Report ``value`` (at ``loc``, described as ``what``) unless it names a state (or a
    state left out for its own field errors)."""
    if value not in spec.states and value not in gaps.states:
        names = list(spec.states)
        err(
            f"{what} '{value}' is not a state of this flow{did_you_mean(value, names)} "
            f"(states: {', '.join(names)})",
            loc,
        )


def _check_states(spec: FlowSpec, err: Report, gaps: Gaps) -> None:
    """Targets exist; each state is one of handler / external / terminal and can be left."""
    _target(spec, err, spec.initial, ("initial",), "initial state", gaps)
    for name, st in spec.states.items():
        here = ("states", name)
        if st.next_ is not None:
            _target(spec, err, st.next_, (*here, "next"), "next", gaps)
        for i, t in enumerate(st.to):
            _target(spec, err, t, (*here, "to", i), "to", gaps)
        for ev, t in st.on_.items():
            _target(spec, err, t, (*here, "on", ev), f"on: {ev} ->", gaps)
        handler = st.exec_ is not None or st.call is not None
        edges = st.next_ is not None or st.to or st.on_ or _leaves(st.deadline, spec.deadline)
        if st.terminal:
            for key, present in (
                ("exec", st.exec_ is not None),
                ("call", st.call is not None),
                ("external", st.external),
                ("next", st.next_ is not None),
                ("to", bool(st.to)),
                ("on", bool(st.on_)),
            ):
                if present:
                    err(
                        f"terminal state '{name}' cannot have {key}: (it ends the flow)",
                        (*here, key),
                        key=True,
                    )
            continue
        if st.exec_ is not None and st.call is not None:
            err(f"state '{name}' has both exec: and call: (choose one)", (*here, "call"), key=True)
        if handler and st.external:
            err(
                f"external state '{name}' cannot have a handler (exec:/call:)",
                (*here, "external"),
                key=True,
            )
        elif not handler and not st.external:
            err(
                f"state '{name}' has nothing to run: give it exec: or call:, or mark it "
                "external: true or terminal: true",
                here,
                key=True,
            )
        elif not edges:
            err(f"state '{name}' has no next:, to: or on: (it could never be left)", here, key=True)


def _leaves(*deadlines: DeadlineSpec | None) -> bool:
    """Whether one of ``deadlines`` ends a stay: its ``then`` is a state or ``failed``."""
    return any(d is not None and d.then not in ("alert", "paused") for d in deadlines)


def _check_reachable(spec: FlowSpec, err: Report) -> None:
    """Every state is reachable from ``initial``, over ``next``/``to``/``on:``, a
    handler state's ``on_exhausted`` and the deadlines' ``then``."""
    states = spec.states

    def exhausted_target(st: StateSpec) -> str | None:
        if not (st.exec_ or st.call):
            return None
        budget = st.error_budget or spec.defaults.error_budget
        return budget.on_exhausted

    if spec.initial not in states:
        return  # already reported
    seen = {spec.initial}
    queue = deque([spec.initial])
    if spec.deadline is not None and spec.deadline.then in states:  # from any state
        seen.add(spec.deadline.then)
        queue.append(spec.deadline.then)
    while queue:
        st = states[queue.popleft()]
        deadline = st.deadline.then if st.deadline is not None else None
        moves = [st.next_, *st.to, *st.on_.values(), exhausted_target(st), deadline]
        for t in [*moves, *routing_targets(spec, st)]:
            if t in states and t not in seen:
                seen.add(t)
                queue.append(t)
    for name in states:
        if name not in seen:
            err(
                f"state '{name}' is unreachable from initial state '{spec.initial}'",
                ("states", name),
                key=True,
            )


def _check_exhausted(spec: FlowSpec, err: Report, gaps: Gaps) -> None:
    """An explicit ``on_exhausted`` is ``failed``, ``paused`` or a state of this flow."""
    names = list(spec.states)

    def exhausted(value: str, loc: tuple[str | int, ...]) -> None:
        if value not in STATUS_OUTCOMES and value not in spec.states and value not in gaps.states:
            err(
                f"on_exhausted '{value}' must be failed, paused or a state of this flow"
                f"{did_you_mean(value, [*STATUS_OUTCOMES, *names])}",
                loc,
            )

    if "on_exhausted" in spec.defaults.error_budget.model_fields_set:
        exhausted(
            spec.defaults.error_budget.on_exhausted, ("defaults", "error_budget", "on_exhausted")
        )
    for name, st in spec.states.items():
        if st.error_budget is not None and "on_exhausted" in st.error_budget.model_fields_set:
            exhausted(
                st.error_budget.on_exhausted, ("states", name, "error_budget", "on_exhausted")
            )


def _check_deadlines(spec: FlowSpec, err: Report, gaps: Gaps) -> None:
    """A deadline's ``then`` is a state of this flow, ``failed``, ``paused`` or ``alert``;
    a terminal state has none (nothing is left to wait for); the flow's counts from the
    instance's start (``since: created``)."""
    names = list(spec.states)

    def then(value: str, loc: tuple[str | int, ...]) -> None:
        if value not in THEN_OUTCOMES and value not in spec.states and value not in gaps.states:
            err(
                f"deadline then '{value}' must be a state of this flow, failed, paused or alert"
                f"{did_you_mean(value, [*THEN_OUTCOMES, *names])}",
                loc,
            )

    if spec.deadline is not None:
        then(spec.deadline.then, ("deadline", "then"))
        if spec.deadline.since == "entered":
            err(
                "the flow's deadline counts from the instance's start: since must be created "
                "(a state's deadline counts from its entry)",
                ("deadline", "since"),
            )
    for name, st in spec.states.items():
        if st.deadline is None:
            continue
        if st.terminal:
            err(
                "a terminal state has no deadline: the instance has ended there",
                ("states", name, "deadline"),
                key=True,
            )
        then(st.deadline.then, ("states", name, "deadline", "then"))


def _check_rules(spec: FlowSpec, err: Report, gaps: Gaps) -> None:
    """Rules name sensors of this flow; selectors and sends aimed at this flow name its
    states and events (other flows are checked by the ``FlowRegistry``)."""
    states = spec.states
    names = list(states)
    for i, rule in enumerate(spec.rules):
        here = ("rules", i)
        if rule.when not in spec.sensors and rule.when not in gaps.sensors:
            known = ", ".join(spec.sensors) or "none"
            err(
                f"rule names unknown sensor '{rule.when}'{did_you_mean(rule.when, spec.sensors)} "
                f"(sensors of this flow: {known})",
                (*here, "when"),
            )
        action = rule.action
        sel = getattr(rule, action)
        if action in ("start", "exec", "webhook") or sel.flow not in (None, spec.flow):
            continue  # other flows are checked by the FlowRegistry
        if sel.state is not None:
            _target(spec, err, sel.state, (*here, action, "state"), "state", gaps)
        if action == "send" and not gaps.edges:
            pool = [sel.state] if sel.state in states else names
            events = {ev for s in pool for ev in states[s].on_}
            if sel.event not in events:
                err(
                    f"no state{'' if sel.state is None else f' {sel.state!r}'} accepts event "
                    f"'{sel.event}'{did_you_mean(sel.event, events)} "
                    f"(events: {', '.join(sorted(events)) or 'none'})",
                    (*here, "send", "event"),
                )


_KIND_NAMES = {"every": "clock", "cron": "clock"}


def _check_event_fields(spec: FlowSpec, err: Report) -> None:
    """Each event field a rule names exists in its sensor's events: ``match`` keys,
    ``{event.x}`` in ``data`` templates and ``{event.x}`` in selector ``data`` regexes
    (which the rules render, escaped, before matching)."""
    for i, rule in enumerate(spec.rules):
        sensor = spec.sensors.get(rule.when)
        if sensor is None:
            continue  # reported by _check_rules
        fields = event_fields(sensor)
        kind = _KIND_NAMES.get(sensor.kind, sensor.kind)
        # (field, loc, shown, at the key)
        used: list[tuple[str, tuple[str | int, ...], str, bool]] = []
        for field in rule.match or {}:
            head = field.split(".")[0]  # a dotted key reaches into a nested field
            used.append((head, ("rules", i, "match", field), f"match key '{field}'", True))
        for key, template in (rule.data or {}).items():
            for path in placeholders(template):
                head, _, rest = path.partition(".")
                if head == "event":
                    name = rest.split(".")[0]
                    used.append((name, ("rules", i, "data", key), f"{{event.{name}}}", False))
        for where, template in delivery_templates(rule):
            for path in placeholders(template):
                head, _, rest = path.partition(".")
                if head == "event":
                    name = rest.split(".")[0]
                    used.append((name, ("rules", i, *where), f"{{event.{name}}}", False))
        if rule.action not in ("start", *DELIVERED):
            sel = getattr(rule, rule.action)
            for key, pattern in (sel.data or {}).items():
                for name in event_refs(pattern):
                    loc: tuple[str | int, ...] = ("rules", i, rule.action, "data", key)
                    used.append((name, loc, f"{{event.{name}}}", False))
        for name, loc, shown, at_key in used:
            if name not in fields:
                err(
                    f"{shown} is not a field of {kind} sensor '{rule.when}' events"
                    f"{did_you_mean(name, fields)} (fields: {', '.join(fields)})",
                    loc,
                    key=at_key,
                )
