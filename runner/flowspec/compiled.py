"""The compiled form of a flow: ``CompiledState`` and ``CompiledFlow`` (built by
``runner.flowspec.compiler``).

Each flow holds ONE ``transitions.Machine`` (``model=None``, ``auto_transitions=False``,
no models registered). Its events are ``goto:<target>`` (one per target state, from
every state whose ``next``/``to`` allows it) and one per ``on:`` event name. Moves are
validated by firing an event on a throw-away ``__slots__`` object.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from transitions import Machine, MachineError

from runner.errors import IllegalMove
from runner.flowspec.deadlines import Deadline
from runner.flowspec.graph import EXHAUSTED, render_graph
from runner.flowspec.loader import did_you_mean
from runner.flowspec.policy import STATUS_OUTCOMES, Policy
from runner.flowspec.setup import NO_SETUP, HandlerSetup
from runner.flowspec.spec import FlowSpec
from runner.flowspec.spec_rules import RuleSpec
from runner.flowspec.spec_sensors import SensorSpec
from runner.labels import NO_ROUTING, Routing


@dataclass(frozen=True)
class CompiledState:
    """One state, ready to run.

    Attributes:
        name: the state's name.
        kind: ``"exec"``, ``"call"``, ``"external"`` or ``"terminal"``.
        argv: an ``exec`` state's argv template (no shell), else ``None``.
        call: a ``call`` state's ``"module:function"``, else ``None``.
        func: the imported ``call`` function, else ``None``.
        next: the state after success, or ``None``.
        to: the states the handler may choose.
        on: ``{event: target state}``.
        policy: the effective policy (durations in seconds).
        description: free text from the flow file, or ``None``.
        setup: the handler's environment variables and secrets.
        pool: the pool whose slots an attempt holds while it runs, or ``None``.
        slots: how many of the pool's slots one attempt holds.
        rate: the state's own rate (``"10/1m"``), or ``None``.
        priority: 1..9, the state's own priority, else the flow's (default 5).
        routing: its ``runs_on`` and ``routing_timeout`` (``runner.flowspec.routing``).
        deadline: the state's deadline (``runner.flowspec.deadlines``), or ``None``.
    """

    name: str
    kind: str
    argv: tuple[str, ...] | None
    call: str | None
    func: Callable[..., Any] | None
    next: str | None
    to: tuple[str, ...]
    on: dict[str, str]
    policy: Policy
    description: str | None = None
    setup: HandlerSetup = NO_SETUP
    pool: str | None = None
    slots: int = 1
    rate: str | None = None
    priority: int = 5
    routing: Routing = NO_ROUTING
    deadline: Deadline | None = None

    @property
    def exhausted_target(self) -> str | None:
        """The state this handler state moves to when its error budget is spent
        (``on_exhausted`` naming a state), else ``None`` (``failed``/``paused``, or not a
        handler state)."""
        if self.kind not in ("exec", "call") or self.policy.on_exhausted in STATUS_OUTCOMES:
            return None
        return self.policy.on_exhausted


class _Probe:
    """The light object fired through the machine to test one move."""

    __slots__ = ("state",)

    def __init__(self, state: str):
        self.state = state


@dataclass
class CompiledFlow:
    """A checked flow.

    Attributes:
        name: the flow's name.
        version: first 16 hex chars of sha256(source).
        path: the flow file's path (as given to the compiler).
        source: the YAML text it was compiled from.
        description: free text from the flow file, or ``None``.
        initial: the initial state's name.
        data: default instance data.
        states: ``{name: CompiledState}`` in file order.
        sensors: ``{name: SensorSpec}``.
        rules: the flow's rules, in file order.
        machine: the ``transitions.Machine`` of the moves (see the module docstring).
        spec: the validated ``FlowSpec`` (``None`` when built by hand).
        label: the ``label`` template naming each instance (``"{data.path}"``), or ``None``.
        route_fields: the event fields its states' ``runs_on`` name (``{event.host}``).
        deadline: the flow's own deadline (since the instance was made), or ``None``.
    """

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
    label: str | None = None
    route_fields: tuple[str, ...] = ()
    deadline: Deadline | None = None

    @functools.cached_property
    def has_deadlines(self) -> bool:
        """Whether the flow or one of its states has a deadline (asked at every move the
        worker commits: computed once)."""
        return self.deadline is not None or any(s.deadline for s in self.states.values())

    @property
    def pools(self) -> dict[str, int]:
        """The pools this file declares: ``{name: slots}`` (empty when built by hand)."""
        if self.spec is None:
            return {}
        return {name: p.slots for name, p in self.spec.pools.items()}

    @property
    def pool_rates(self) -> dict[str, str]:
        """The rates of the pools this file declares with one: ``{name: "10/1m"}``."""
        if self.spec is None:
            return {}
        return {name: p.rate for name, p in self.spec.pools.items() if p.rate}

    @property
    def max_running(self) -> tuple[int, str | None] | None:
        """The flow limit: ``(limit, key template or None)``, ``None`` without one."""
        if self.spec is None or self.spec.max_running is None:
            return None
        return self.spec.max_running.limit, self.spec.max_running.key

    @property
    def on_limit(self) -> str:
        """What a rule's start does at the limit: ``queue`` or ``skip``."""
        return "queue" if self.spec is None else self.spec.on_limit

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
        """States ``state`` may move to by ``next``/``to`` (from the machine), in order.

        An unknown ``state`` has no moves (``[]``); raises nothing.
        """
        return [
            name[5:]
            for name, ev in self.machine.events.items()
            if name.startswith("goto:") and state in ev.transitions
        ]

    def events_from(self, state: str) -> list[str]:
        """Names of the ``on:`` events accepted in ``state`` (``[]`` if none or unknown)."""
        return [
            name
            for name, ev in self.machine.events.items()
            if not name.startswith("goto:") and state in ev.transitions
        ]

    def check_move(self, source: str, target: str) -> None:
        """Check that state ``source`` may go to state ``target`` via ``next``/``to``.

        Raises:
            IllegalMove: ``source`` is not a state, or the move is not allowed (the
                message lists the allowed targets).
        """
        self._known(source)
        if self._fire(f"goto:{target}", source) != target:
            allowed = ", ".join(self.moves_from(source)) or "none"
            unknown = "" if target in self.states else " (no such state)"
            raise IllegalMove(
                f"illegal move in flow {self.name}: state '{source}' cannot go to "
                f"'{target}'{unknown} (allowed: {allowed})"
            )

    def event_target(self, state: str, event: str) -> str:
        """The target of ``on: {event: target}`` in ``state``.

        Raises:
            IllegalMove: ``state`` is not a state, or it does not accept ``event`` (the
                message lists the accepted events).
        """
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
        """``(source, target, label)`` for every transition of the compiled machine, then
        each handler state's ``on_exhausted`` move to a state (label ``"on_exhausted"``),
        ordered by source state; label ``None`` marks a ``next``/``to`` move, else it is the
        ``on:`` event's name. Raises nothing."""
        out: list[tuple[str, str, str | None]] = []
        for name, ev in self.machine.events.items():
            label = None if name.startswith("goto:") else name
            for transitions in ev.transitions.values():
                # every transition the compiler adds has a dest (None: internal ones)
                out.extend((t.source, cast(str, t.dest), label) for t in transitions)
        for name, st in self.states.items():
            if st.exhausted_target is not None:
                out.append((name, st.exhausted_target, EXHAUSTED))
        order = {s: i for i, s in enumerate(self.states)}
        out.sort(key=lambda e: (order[e[0]], e[2] is not None))
        return out

    def graph(self, fmt: str = "mermaid", current: str | None = None) -> str:
        """The state graph as Mermaid (``stateDiagram-v2``) or Graphviz ``dot`` text.

        Args:
            fmt: ``"mermaid"`` or ``"dot"``.
            current: a state to highlight (e.g. an instance's state), or ``None``;
                a name that is not a state of this flow is ignored.

        Raises:
            ValueError: an unknown ``fmt``.
        """
        return render_graph(self, fmt, current)
