"""Compile a flow file into a ``CompiledFlow``: checked graph, policies, transitions machine.

The pipeline: ``load_flow_partial`` (YAML + field validation, ``runner.flowspec.loader``),
the graph-level checks (``runner.flowspec.checks``), the ``call`` imports, each state's
effective policy (``runner.flowspec.policy``) and the flow's ``transitions.Machine``
(``runner.flowspec.compiled`` describes its events). Every problem found is reported at
once, with its position: a file with field errors is checked and imported without the
broken parts (``runner.flowspec.partial``), so its independent mistakes of every stage
come in one report.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transitions import Machine

from runner.errors import FlowError, FlowErrors
from runner.flowspec import deadlines
from runner.flowspec.checks import check_flow
from runner.flowspec.compiled import CompiledFlow, CompiledState
from runner.flowspec.limits import read_flow_file
from runner.flowspec.loader import did_you_mean, load_flow_partial
from runner.flowspec.partial import LeftOut
from runner.flowspec.policy import state_policy
from runner.flowspec.routing import event_fields_named, state_routing
from runner.flowspec.setup import state_setup
from runner.flowspec.spec import FlowSpec, StateSpec
from runner.flowspec.spec_rules import ON_FAILURE, ON_FAILURE_KINDS
from runner.flowspec.spec_sensors import SensorSpec


def _import(call: str, folder: str) -> tuple[Callable[..., Any] | None, str | None]:
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


def _machine(spec: FlowSpec) -> Machine:
    machine = Machine(model=None, states=list(spec.states), initial=None, auto_transitions=False)
    sources: dict[str, list[str]] = {}
    for name, st in spec.states.items():
        for t in dict.fromkeys([*([st.next_] if st.next_ else []), *st.to]):
            sources.setdefault(t, []).append(name)
    for t, srcs in sources.items():
        machine.add_transition(f"goto:{t}", [*srcs], t)
    for name, st in spec.states.items():
        for ev, t in st.on_.items():
            machine.add_transition(ev, name, t)
    return machine


def compile_source(source: str, path: str | Path, *, imports: bool = True) -> CompiledFlow:
    """Parse, validate, check and compile one flow file's text.

    Args:
        source: the YAML text.
        path: the file path (messages, default flow name, folder for ``call`` imports;
            that folder is put on ``sys.path``).
        imports: ``False``: import no ``call`` module (each ``func`` is ``None``), for a
            reader that only shows the flow (``runner.flowspec.facts``).

    Raises:
        FlowErrors: every problem found, each with ``file:line:col``, sorted by position.
    """
    file = str(path)
    loaded = load_flow_partial(source, file)
    spec, errors, left = loaded.spec, list(loaded.errors), loaded.left
    if spec is None:
        raise FlowErrors(errors)

    def err(message: str, loc: tuple[str | int, ...], *, key: bool = False) -> None:
        if left.touches(loc):
            return  # about a part left out for its field error: maybe not a mistake
        line, col = spec.position(loc, key=key)
        errors.append(FlowError(message, file, line, col))

    check_flow(spec, err, left.gaps(loaded.data))
    folder = str(Path(file).resolve().parent)
    states: dict[str, CompiledState] = {}
    for name, st in spec.states.items():
        func = None
        if imports and st.call is not None and not st.terminal:
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
            policy=state_policy(spec.defaults, st),
            description=st.description,
            setup=state_setup(spec.defaults, st),
            pool=st.pool,
            slots=st.slots or 1,
            rate=st.rate,
            priority=st.priority or spec.priority,
            routing=state_routing(spec.defaults, st),
            deadline=deadlines.from_spec(st.deadline, "state"),
        )
    if errors:
        errors.sort(key=lambda e: (e.line or 0, e.col or 0))
        part = PartialFlow(_compiled(spec, source, file, states), left) if spec.flow else None
        raise FlowErrors(errors, part)
    return _compiled(spec, source, file, states)


@dataclass(frozen=True)
class PartialFlow:
    """A flow file with errors compiled from the parts of it that validated, for the
    cross-flow checks that still hold (``FlowRegistry``): never loaded, never run.

    Attributes:
        flow: the ``CompiledFlow`` of what validated.
        left: the nodes left out for their field errors (``LeftOut.hides`` says which
            cross-flow problems they could cause).
    """

    flow: CompiledFlow
    left: LeftOut


def _compiled(
    spec: FlowSpec, source: str, file: str, states: dict[str, CompiledState]
) -> CompiledFlow:
    """The ``CompiledFlow`` of a checked ``spec`` (its flow name set) and its ``states``."""
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
        sensors={**spec.sensors, **on_failure_sensor(spec)},
        rules=[*spec.rules, *([spec.on_failure.rule()] if spec.on_failure else [])],
        machine=_machine(spec),
        spec=spec,
        label=spec.label,
        route_fields=tuple(event_fields_named(spec)),
        deadline=deadlines.from_spec(spec.deadline, "flow"),
    )


def on_failure_sensor(spec: FlowSpec) -> dict[str, SensorSpec]:
    """The ``lifecycle`` sensor a flow's ``on_failure:`` declares (none without it)."""
    if spec.on_failure is None:
        return {}
    lifecycle = {"flows": [spec.name], "on": list(ON_FAILURE_KINDS)}
    return {ON_FAILURE: SensorSpec.model_validate({"lifecycle": lifecycle})}


def load_flow(path: str | Path) -> CompiledFlow:
    """Read (UTF-8, within ``runner.flowspec.limits``) and compile the flow file at ``path``.

    Raises:
        FlowErrors: the file cannot be read (too large, not UTF-8: with its position), or
            every problem ``compile_source`` found.
    """
    return compile_source(read_flow_file(path), path)
