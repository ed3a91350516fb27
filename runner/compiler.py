"""Compile a flow file into a ``CompiledFlow``: checked graph, policies, transitions machine.

Each flow becomes ONE ``transitions.Machine`` (``model=None``, ``auto_transitions=False``,
no models registered). Its events are ``goto:<target>`` (one per target state, from
every state whose ``next``/``to`` allows it) and one per ``on:`` event name. Moves are
validated by firing an event on a throw-away ``__slots__`` object.
"""

from __future__ import annotations

import hashlib
import importlib
import random
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transitions import Machine, MachineError

from runner.errors import FlowError, FlowErrors, IllegalMove
from runner.flowfile import did_you_mean, load_flow_text
from runner.spec import (
    BackoffSpec,
    Defaults,
    ErrorBudgetSpec,
    FlowSpec,
    RuleSpec,
    SensorSpec,
    StateSpec,
)

STATUS_OUTCOMES = ("failed", "paused")
"""``on_exhausted`` values that name a status rather than a state."""


@dataclass(frozen=True)
class Backoff:
    """Delay after consecutive errors: ``initial * factor**(n-1)`` capped at ``max`` (seconds)."""

    initial: float
    factor: float
    max: float
    jitter: str  # full | equal | none

    def delay(self, errors: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``errors``-th consecutive error (``errors >= 1``)."""
        base = min(self.max, self.initial * self.factor ** max(0, errors - 1))
        if self.jitter == "full":
            return base * rand()
        if self.jitter == "equal":
            return base / 2 + base / 2 * rand()
        return base


@dataclass(frozen=True)
class Policy:
    """Effective per-state policy (defaults overridden by the state). Durations in seconds."""

    try_interval: float
    timeout: float | None
    keepalive: float | None
    max_errors: int
    window: float
    on_exhausted: str  # "failed" | "paused" | a state name
    backoff: Backoff
    max_restarts: int


@dataclass(frozen=True)
class CompiledState:
    """One state, ready to run. ``kind`` is ``exec``, ``call``, ``external`` or ``terminal``."""

    name: str
    kind: str
    argv: tuple[str, ...] | None
    call: str | None
    func: Callable | None
    next: str | None
    to: tuple[str, ...]
    on: dict[str, str]
    policy: Policy
    description: str | None = None


class _Probe:
    """The light object fired through the machine to test one move."""

    __slots__ = ("state",)

    def __init__(self, state: str):
        self.state = state


@dataclass
class CompiledFlow:
    """A checked flow. ``version`` = first 16 hex chars of sha256(source)."""

    name: str
    version: str
    path: str
    source: str
    description: str | None
    initial: str
    data: dict[str, Any]
    states: dict[str, CompiledState]
    sensors: dict[str, SensorSpec]
    rules: list[RuleSpec]
    machine: Machine
    spec: FlowSpec | None = field(default=None, repr=False)

    def _fire(self, event: str, state: str) -> str | None:
        ev = self.machine.events.get(event)
        if ev is None:
            return None
        probe = _Probe(state)
        try:
            ok = ev.trigger(probe)
        except (MachineError, KeyError, ValueError):
            return None
        return probe.state if ok else None

    def _known(self, state: str) -> None:
        if state not in self.states:
            raise IllegalMove(
                f"unknown state '{state}' in flow {self.name}{did_you_mean(state, self.states)} "
                f"(states: {', '.join(self.states)})"
            )

    def moves_from(self, state: str) -> list[str]:
        """States ``state`` may move to by ``next``/``to`` (from the machine), in order."""
        return [
            name[5:]
            for name, ev in self.machine.events.items()
            if name.startswith("goto:") and state in ev.transitions
        ]

    def events_from(self, state: str) -> list[str]:
        """Names of the ``on:`` events accepted in ``state``."""
        return [
            name
            for name, ev in self.machine.events.items()
            if not name.startswith("goto:") and state in ev.transitions
        ]

    def check_move(self, source: str, target: str) -> None:
        """Raise ``IllegalMove`` unless ``source`` may go to ``target`` via ``next``/``to``."""
        self._known(source)
        if self._fire(f"goto:{target}", source) != target:
            allowed = ", ".join(self.moves_from(source)) or "none"
            unknown = "" if target in self.states else " (no such state)"
            raise IllegalMove(
                f"illegal move in flow {self.name}: state '{source}' cannot go to "
                f"'{target}'{unknown} (allowed: {allowed})"
            )

    def event_target(self, state: str, event: str) -> str:
        """The target of ``on: {event: target}`` in ``state``; raises ``IllegalMove``."""
        self._known(state)
        target = None if event.startswith("goto:") else self._fire(event, state)
        if target is None:
            allowed = ", ".join(self.events_from(state)) or "none"
            raise IllegalMove(
                f"illegal event in flow {self.name}: state '{state}' does not accept "
                f"event '{event}' (allowed: {allowed})"
            )
        return target

    def edges(self) -> list[tuple[str, str, str | None]]:
        """``(source, target, event or None)`` for every transition of the compiled machine,
        ordered by source state; ``None`` marks a ``next``/``to`` move."""
        out: list[tuple[str, str, str | None]] = []
        for name, ev in self.machine.events.items():
            label = None if name.startswith("goto:") else name
            for transitions in ev.transitions.values():
                out.extend((t.source, t.dest, label) for t in transitions)
        order = {s: i for i, s in enumerate(self.states)}
        out.sort(key=lambda e: (order[e[0]], e[2] is not None))
        return out

    def graph(self, fmt: str = "mermaid", current: str | None = None) -> str:
        """The state graph as Mermaid (``stateDiagram-v2``) or Graphviz ``dot`` text.

        Args:
            fmt: ``"mermaid"`` or ``"dot"``.
            current: a state to highlight (e.g. an instance's state), or ``None``;
                a name that is not a state of this flow is ignored.
        """
        terminal = [s for s, st in self.states.items() if st.kind == "terminal"]
        if current not in self.states:
            current = None  # e.g. a state of an older version: nothing to highlight
        if fmt == "mermaid":
            lines = ["stateDiagram-v2", f"    [*] --> {self.initial}"]
            for src, dst, label in self.edges():
                lines.append(f"    {src} --> {dst}" + (f": {label}" if label else ""))
            lines += [f"    {s} --> [*]" for s in terminal]
            lines.append("    classDef terminal fill:#e0e0e0,stroke:#616161")
            lines.append("    classDef current fill:#ffd54f,stroke:#f57f17,stroke-width:3px")
            lines += [f"    class {s} terminal" for s in terminal]
            if current is not None:
                lines.append(f"    class {current} current")
            return "\n".join(lines) + "\n"
        if fmt == "dot":
            lines = [
                f'digraph "{self.name}" {{',
                "    rankdir=LR;",
                "    node [shape=box, style=rounded];",
                '    "__start__" [shape=point, label=""];',
                f'    "__start__" -> "{self.initial}";',
            ]
            lines += [f'    "{s}" [shape=doublecircle];' for s in terminal]
            if current is not None:
                lines.append(
                    f'    "{current}" [style="rounded,filled,bold", fillcolor="#ffd54f", '
                    'penwidth=3, xlabel="current"];'
                )
            for src, dst, label in self.edges():
                lines.append(f'    "{src}" -> "{dst}"' + (f' [label="{label}"];' if label else ";"))
            lines.append("}")
            return "\n".join(lines) + "\n"
        raise ValueError(f"unknown graph format {fmt!r} (expected mermaid or dot)")


# --------------------------------------------------------------------------- compiling


def _policy(defaults: Defaults, st: StateSpec) -> Policy:
    given = st.model_fields_set

    def pick(key: str) -> Any:
        value = getattr(st, key)
        if key in given and (value is not None or key in ("timeout", "keepalive")):
            return value
        return getattr(defaults, key)

    def merge(base: Any, over: Any) -> Any:
        if over is None:
            return base
        return base.model_copy(update={k: getattr(over, k) for k in over.model_fields_set})

    budget: ErrorBudgetSpec = merge(defaults.error_budget, st.error_budget)
    backoff: BackoffSpec = merge(defaults.backoff, st.backoff)
    return Policy(
        try_interval=pick("try_interval"),
        timeout=pick("timeout"),
        keepalive=pick("keepalive"),
        max_errors=budget.max_errors,
        window=budget.window,
        on_exhausted=budget.on_exhausted,
        backoff=Backoff(backoff.initial, backoff.factor, backoff.max, backoff.jitter),
        max_restarts=pick("max_restarts"),
    )


def _import(call: str, folder: str) -> tuple[Callable | None, str | None]:
    """Import ``module:function`` with ``folder`` on ``sys.path``; return (func, error)."""
    module_name, func_name = call.split(":", 1)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any failure while importing user code is a load error
        return None, f"cannot import module '{module_name}' for call: {type(exc).__name__}: {exc}"
    func = getattr(module, func_name, None)
    if func is None:
        names = [n for n in vars(module) if not n.startswith("_")]
        hint = did_you_mean(func_name, names)
        return None, f"module '{module_name}' has no function '{func_name}'{hint}"
    if not callable(func):
        return None, f"'{call}' is not callable"
    return func, None


def _kind(st: StateSpec) -> str:
    if st.terminal:
        return "terminal"
    if st.exec_ is not None:
        return "exec"
    if st.call is not None:
        return "call"
    return "external"


def _check(spec: FlowSpec, err: Callable[..., None]) -> None:
    """Graph-level checks; calls ``err(message, loc, key=...)`` for each problem."""
    states = spec.states
    names = list(states)

    def target(value: str, loc: tuple, what: str) -> None:
        if value not in states:
            err(
                f"{what} '{value}' is not a state of this flow{did_you_mean(value, names)} "
                f"(states: {', '.join(names)})",
                loc,
            )

    target(spec.initial, ("initial",), "initial state")
    for name, st in states.items():
        here = ("states", name)
        if st.next_ is not None:
            target(st.next_, (*here, "next"), "next")
        for i, t in enumerate(st.to):
            target(t, (*here, "to", i), "to")
        for ev, t in st.on_.items():
            target(t, (*here, "on", ev), f"on: {ev} ->")
        handler = st.exec_ is not None or st.call is not None
        edges = st.next_ is not None or st.to or st.on_
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

    # reachability from initial, over next/to/on and a handler state's on_exhausted
    def exhausted_target(st: StateSpec) -> str | None:
        if not (st.exec_ or st.call):
            return None
        budget = st.error_budget or spec.defaults.error_budget
        return budget.on_exhausted

    if spec.initial in states:
        seen = {spec.initial}
        queue = deque([spec.initial])
        while queue:
            st = states[queue.popleft()]
            for t in [st.next_, *st.to, *st.on_.values(), exhausted_target(st)]:
                if t in states and t not in seen:
                    seen.add(t)
                    queue.append(t)
        for name in names:
            if name not in seen:
                err(
                    f"state '{name}' is unreachable from initial state '{spec.initial}'",
                    ("states", name),
                    key=True,
                )

    # on_exhausted: failed | paused | a state
    def exhausted(value: str, loc: tuple) -> None:
        if value not in STATUS_OUTCOMES and value not in states:
            err(
                f"on_exhausted '{value}' must be failed, paused or a state of this flow"
                f"{did_you_mean(value, [*STATUS_OUTCOMES, *names])}",
                loc,
            )

    if "on_exhausted" in spec.defaults.error_budget.model_fields_set:
        exhausted(
            spec.defaults.error_budget.on_exhausted, ("defaults", "error_budget", "on_exhausted")
        )
    for name, st in states.items():
        if st.error_budget is not None and "on_exhausted" in st.error_budget.model_fields_set:
            exhausted(
                st.error_budget.on_exhausted, ("states", name, "error_budget", "on_exhausted")
            )

    # rules: sensors of this flow; sends/selectors aimed at this flow
    for i, rule in enumerate(spec.rules):
        here = ("rules", i)
        if rule.when not in spec.sensors:
            known = ", ".join(spec.sensors) or "none"
            err(
                f"rule names unknown sensor '{rule.when}'{did_you_mean(rule.when, spec.sensors)} "
                f"(sensors of this flow: {known})",
                (*here, "when"),
            )
        action = rule.action
        sel = getattr(rule, action)
        if action == "start" or sel.flow not in (None, spec.flow):
            continue  # other flows are checked by the FlowRegistry
        if sel.state is not None:
            target(sel.state, (*here, action, "state"), "state")
        if action == "send":
            pool = [sel.state] if sel.state in states else names
            events = {ev for s in pool for ev in states[s].on_}
            if sel.event not in events:
                err(
                    f"no state{'' if sel.state is None else f' {sel.state!r}'} accepts event "
                    f"'{sel.event}'{did_you_mean(sel.event, events)} "
                    f"(events: {', '.join(sorted(events)) or 'none'})",
                    (*here, "send", "event"),
                )


def _machine(spec: FlowSpec) -> Machine:
    machine = Machine(model=None, states=list(spec.states), initial=None, auto_transitions=False)
    sources: dict[str, list[str]] = {}
    for name, st in spec.states.items():
        for t in dict.fromkeys([*([st.next_] if st.next_ else []), *st.to]):
            sources.setdefault(t, []).append(name)
    for t, srcs in sources.items():
        machine.add_transition(f"goto:{t}", srcs, t)
    for name, st in spec.states.items():
        for ev, t in st.on_.items():
            machine.add_transition(ev, name, t)
    return machine


def compile_source(source: str, path: str | Path) -> CompiledFlow:
    """Parse, validate, check and compile one flow file's text.

    Args:
        source: the YAML text.
        path: the file path (messages, default flow name, folder for ``call`` imports).

    Raises:
        FlowErrors: every problem found, each with ``file:line:col``.
    """
    file = str(path)
    spec = load_flow_text(source, file)
    errors: list[FlowError] = []

    def err(message: str, loc: tuple, *, key: bool = False) -> None:
        line, col = spec.position(loc, key=key)
        errors.append(FlowError(message, file, line, col))

    _check(spec, err)
    folder = str(Path(file).resolve().parent)
    states: dict[str, CompiledState] = {}
    for name, st in spec.states.items():
        func = None
        if st.call is not None and not st.terminal:
            func, problem = _import(st.call, folder)
            if problem:
                err(problem, ("states", name, "call"))
        states[name] = CompiledState(
            name=name,
            kind=_kind(st),
            argv=tuple(st.exec_) if st.exec_ is not None else None,
            call=st.call,
            func=func,
            next=st.next_,
            to=tuple(st.to),
            on=dict(st.on_),
            policy=_policy(spec.defaults, st),
            description=st.description,
        )
    if errors:
        errors.sort(key=lambda e: (e.line or 0, e.col or 0))
        raise FlowErrors(errors)
    assert spec.flow is not None
    return CompiledFlow(
        name=spec.flow,
        version=hashlib.sha256(source.encode()).hexdigest()[:16],
        path=file,
        source=source,
        description=spec.description,
        initial=spec.initial,
        data=dict(spec.data),
        states=states,
        sensors=dict(spec.sensors),
        rules=list(spec.rules),
        machine=_machine(spec),
        spec=spec,
    )


def load_flow(path: str | Path) -> CompiledFlow:
    """Read and compile the flow file at ``path``; raises ``FlowErrors``."""
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlowErrors([FlowError(f"cannot read flow file: {exc}", str(path))]) from None
    return compile_source(source, path)
