"""runner.flowspec.compiler: graph checks with positions, policies, the machine, graphs."""

from __future__ import annotations

import hashlib
import textwrap
import uuid
from pathlib import Path

import pytest

from runner.errors import FlowErrors, IllegalMove
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.compiler import compile_source, load_flow
from runner.flowspec.policy import Backoff


def write(tmp_path: Path, text: str, name: str = "flow.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def errors(tmp_path: Path, text: str) -> list[str]:
    path = write(tmp_path, text)
    with pytest.raises(FlowErrors) as info:
        load_flow(path)
    assert all(e.file == str(path) for e in info.value.errors)
    return [f"{e.line}:{e.col}: {e.message}" for e in info.value.errors]


def handler_module(tmp_path: Path) -> str:
    """A uniquely named handler module next to the flow file (no sys.modules clashes)."""
    name = f"handlers_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def summarise(ctx):\n    return 'archive'\n")
    return name


GOOD = """\
initial: validate
defaults:
  timeout: 1m
  error_budget: {max_errors: 3, on_exhausted: quarantine}
  backoff: {initial: 1s}
states:
  validate:
    exec: [python, -m, x, "{data.path}"]
    next: summarise
    timeout: null
  summarise:
    call: MOD:summarise
    to: [archive, quarantine]
    keepalive: 20s
    error_budget: {window: 1h}
    backoff: {jitter: none}
  archive:
    exec: [python, -m, y, "{data.path}"]
    next: done
    try_interval: 5s
    max_restarts: 1
  quarantine:
    external: true
    on: {release: validate, discard: done}
  done: {terminal: true}
sensors:
  tick: {every: 1m}
rules:
  - when: tick
    send: {event: release, state: quarantine}
"""


@pytest.fixture
def flow(tmp_path: Path) -> CompiledFlow:
    mod = handler_module(tmp_path)
    return load_flow(write(tmp_path, GOOD.replace("MOD", mod), "csv_ingest.yaml"))


def test_compiled_states_and_policies(flow: CompiledFlow) -> None:
    assert flow.name == "csv_ingest" and flow.initial == "validate"
    assert flow.version == hashlib.sha256(flow.source.encode()).hexdigest()[:16]
    kinds = {n: s.kind for n, s in flow.states.items()}
    assert kinds == {
        "validate": "exec",
        "summarise": "call",
        "archive": "exec",
        "quarantine": "external",
        "done": "terminal",
    }
    v, s, a = flow.states["validate"], flow.states["summarise"], flow.states["archive"]
    assert v.argv == ("python", "-m", "x", "{data.path}") and v.next == "summarise"
    assert v.policy.timeout is None  # explicit null beats the default
    assert s.func is not None and s.func(None) == "archive" and s.to == ("archive", "quarantine")
    assert s.policy.timeout == 60 and s.policy.keepalive == 20
    assert (s.policy.max_errors, s.policy.window, s.policy.on_exhausted) == (3, 3600, "quarantine")
    assert s.policy.backoff == Backoff(initial=1.0, factor=2.0, max=600.0, jitter="none")
    assert v.policy.backoff.jitter == "full" and v.policy.window == 14400
    assert (a.policy.try_interval, a.policy.max_restarts) == (5, 1)
    assert (v.policy.try_interval, v.policy.max_restarts) == (30, 5)
    assert flow.states["quarantine"].on == {"release": "validate", "discard": "done"}


def test_machine_shape(flow: CompiledFlow) -> None:
    m = flow.machine
    assert m.models == [] and not m.auto_transitions
    assert set(m.events) == {
        "goto:summarise",
        "goto:archive",
        "goto:quarantine",
        "goto:done",
        "release",
        "discard",
    }
    assert sorted(m.events["goto:done"].transitions) == ["archive"]


def test_check_move(flow: CompiledFlow) -> None:
    flow.check_move("validate", "summarise")
    flow.check_move("summarise", "quarantine")
    with pytest.raises(IllegalMove) as info:
        flow.check_move("validate", "done")
    assert str(info.value) == (
        "illegal move in flow csv_ingest: state 'validate' cannot go to 'done' (allowed: summarise)"
    )
    with pytest.raises(IllegalMove, match=r"'nowhere' \(no such state\) \(allowed: archive, "):
        flow.check_move("summarise", "nowhere")
    with pytest.raises(IllegalMove, match=r"cannot go to 'validate' \(allowed: none\)"):
        flow.check_move("quarantine", "validate")  # only by the release event
    with pytest.raises(IllegalMove, match="unknown state 'valdate'.*did you mean 'validate'"):
        flow.check_move("valdate", "summarise")


def test_events(flow: CompiledFlow) -> None:
    assert flow.event_target("quarantine", "release") == "validate"
    assert flow.event_target("quarantine", "discard") == "done"
    assert flow.events_from("quarantine") == ["release", "discard"]
    assert flow.events_from("validate") == []
    assert flow.moves_from("summarise") == ["archive", "quarantine"]
    with pytest.raises(IllegalMove) as info:
        flow.event_target("validate", "release")
    assert str(info.value) == (
        "illegal event in flow csv_ingest: state 'validate' does not accept event 'release' "
        "(allowed: none)"
    )
    with pytest.raises(IllegalMove, match=r"\(allowed: release, discard\)"):
        flow.event_target("quarantine", "goto:done")


def test_graph_mermaid(flow: CompiledFlow) -> None:
    assert flow.graph("mermaid", current="summarise") == textwrap.dedent("""\
        stateDiagram-v2
            [*] --> validate
            validate --> summarise
            validate --> quarantine: on_exhausted
            summarise --> archive
            summarise --> quarantine
            summarise --> quarantine: on_exhausted
            archive --> done
            archive --> quarantine: on_exhausted
            quarantine --> validate: release
            quarantine --> done: discard
            done --> [*]
            classDef terminal fill:#e0e0e0,stroke:#616161
            classDef current fill:#ffd54f,stroke:#f57f17,stroke-width:3px
            class done terminal
            class summarise current
        """)
    assert "current" not in flow.graph().splitlines()[-1]


def test_graph_shows_on_exhausted_edges(tmp_path: Path) -> None:
    """A state entered only when a budget is spent is drawn with its edge, not unreachable;
    ``failed``/``paused`` and external states draw none."""
    flow = load_flow(
        write(
            tmp_path,
            "initial: fetch\n"
            "defaults: {error_budget: {on_exhausted: paused}}\n"
            "states:\n"
            "  fetch: {exec: [x], next: done, error_budget: {on_exhausted: repair}}\n"
            "  repair: {external: true, on: {fixed: fetch}}\n"
            "  done: {terminal: true}\n",
        )
    )
    assert flow.edges() == [
        ("fetch", "done", None),
        ("fetch", "repair", "on_exhausted"),
        ("repair", "fetch", "fixed"),
    ]
    assert "    fetch --> repair: on_exhausted\n" in flow.graph("mermaid")
    assert '"fetch" -> "repair" [label="on_exhausted", style=dashed];' in flow.graph("dot")


def test_graph_dot(flow: CompiledFlow) -> None:
    dot = flow.graph("dot", current="quarantine")
    assert dot.startswith('digraph "csv_ingest" {\n') and dot.endswith("}\n")
    assert '    "__start__" -> "validate";' in dot
    assert '    "done" [shape=doublecircle];' in dot
    assert '"quarantine" [style="rounded,filled,bold"' in dot
    assert '    "quarantine" -> "validate" [label="release"];' in dot
    assert '    "validate" -> "summarise";' in dot
    assert '    "archive" -> "quarantine" [label="on_exhausted", style=dashed];' in dot
    assert dot.count("->") == 10
    with pytest.raises(ValueError, match="mermaid or dot"):
        flow.graph("svg")


def test_backoff_delay() -> None:
    b = Backoff(initial=10, factor=2, max=60, jitter="none")
    assert [b.delay(n) for n in (1, 2, 3, 4)] == [10, 20, 40, 60]
    assert Backoff(10, 2, 60, "full").delay(2, rand=lambda: 0.5) == 10
    assert Backoff(10, 2, 60, "equal").delay(2, rand=lambda: 0.0) == 10


def test_compile_source_equals_load_flow(tmp_path: Path) -> None:
    text = "initial: a\nstates:\n  a: {terminal: true}\n"
    path = write(tmp_path, text, "tiny.yaml")
    assert compile_source(text, str(path)).version == load_flow(path).version


# ------------------------------------------------------------------ errors with positions


def test_initial_and_targets_must_exist(tmp_path: Path) -> None:
    text = """\
        initial: strat
        states:
          start: {exec: [a], next: finsh, to: [start, nope]}
          wait: {external: true, on: {go: dne}}
          finish: {terminal: true}
        """
    out = errors(tmp_path, text)
    assert out[0] == (
        "1:10: initial state 'strat' is not a state of this flow (did you mean 'start'?) "
        "(states: start, wait, finish)"
    )
    assert out[1] == (
        "3:28: next 'finsh' is not a state of this flow (did you mean 'finish'?) "
        "(states: start, wait, finish)"
    )
    assert out[2].startswith("3:47: to 'nope' is not a state of this flow (states:")
    assert out[3].startswith("4:35: on: go -> 'dne' is not a state of this flow")
    assert len(out) == 4  # unreachability is not reported when initial is unknown


def test_unreachable_states(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {exec: [x], next: b}
          b: {terminal: true}
          island: {exec: [x], next: b}
        """
    assert errors(tmp_path, text) == ["5:3: state 'island' is unreachable from initial state 'a'"]


def test_handler_rules(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {exec: [x], call: "m:f", next: b}
          b: {to: [c]}
          c: {external: true, exec: [x], next: d}
          d: {exec: [x]}
          e: {external: true}
        """
    out = errors(tmp_path, text)
    assert out == [
        "3:18: state 'a' has both exec: and call: (choose one)",
        "3:24: cannot import module 'm' for call: ModuleNotFoundError: No module named 'm'",
        "4:3: state 'b' has nothing to run: give it exec: or call:, or mark it external: true "
        "or terminal: true",
        "5:7: external state 'c' cannot have a handler (exec:/call:)",
        "6:3: state 'd' has no next:, to: or on: (it could never be left)",
        "7:3: state 'e' has no next:, to: or on: (it could never be left)",
        "7:3: state 'e' is unreachable from initial state 'a'",
    ]
    # the call of state a is still imported and reported
    assert any("cannot import module 'm'" in o for o in out)


def test_terminal_state_with_handler_or_edges(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {exec: [x], next: done}
          done:
            terminal: true
            exec: [y]
            on: {again: a}
        """
    assert errors(tmp_path, text) == [
        "6:5: terminal state 'done' cannot have exec: (it ends the flow)",
        "7:5: terminal state 'done' cannot have on: (it ends the flow)",
    ]


def test_on_exhausted_values(tmp_path: Path) -> None:
    text = """\
        initial: a
        defaults:
          error_budget: {on_exhausted: pasued}
        states:
          a: {exec: [x], next: b, error_budget: {on_exhausted: nowhere}}
          b: {exec: [x], next: c, error_budget: {on_exhausted: a}}
          c: {terminal: true}
        """
    assert errors(tmp_path, text) == [
        "3:32: on_exhausted 'pasued' must be failed, paused or a state of this flow "
        "(did you mean 'paused'?)",
        "5:56: on_exhausted 'nowhere' must be failed, paused or a state of this flow",
    ]


def test_call_import_errors(tmp_path: Path) -> None:
    mod = handler_module(tmp_path)
    text = f"""\
        initial: a
        states:
          a: {{call: "{mod}:summarize", to: [b, c]}}
          b: {{call: "no_such_module_xyz:f", next: c}}
          c: {{terminal: true}}
        """
    assert errors(tmp_path, text) == [
        f"3:13: module '{mod}' has no function 'summarize' (did you mean 'summarise'?)",
        "4:13: cannot import module 'no_such_module_xyz' for call: ModuleNotFoundError: "
        "No module named 'no_such_module_xyz'",
    ]


def test_call_module_that_raises_on_import(tmp_path: Path) -> None:
    name = f"broken_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('boom')\n")
    text = f"initial: a\nstates:\n  a: {{call: '{name}:f', next: b}}\n  b: {{terminal: true}}\n"
    assert errors(tmp_path, text) == [
        f"3:13: cannot import module '{name}' for call: RuntimeError: boom"
    ]


def test_rules_must_name_sensors_states_and_events_of_this_flow(tmp_path: Path) -> None:
    text = """\
        flow: f
        initial: a
        states:
          a: {external: true, on: {go: b}}
          b: {terminal: true}
        sensors:
          inbox: {every: 5s}
        rules:
          - {when: inbx, start: f}
          - {when: inbox, send: {event: gone, flow: f}}
          - {when: inbox, kill: {state: c}}
          - {when: inbox, send: {event: go, state: b}}
          - {when: inbox, send: {event: anything, flow: other_flow}}
        """
    assert errors(tmp_path, text) == [
        "9:12: rule names unknown sensor 'inbx' (did you mean 'inbox'?) "
        "(sensors of this flow: inbox)",
        "10:33: no state accepts event 'gone' (did you mean 'go'?) (events: go)",
        "11:33: state 'c' is not a state of this flow (states: a, b)",
        "12:33: no state 'b' accepts event 'go' (events: none)",
    ]


def test_state_reached_only_through_on_exhausted_is_reachable(tmp_path: Path) -> None:
    mod = handler_module(tmp_path)
    path = write(
        tmp_path,
        f"""\
        initial: work
        states:
          work:
            call: {mod}:summarise
            next: done
            error_budget: {{max_errors: 2, on_exhausted: review}}
          review:
            external: true
            on: {{retry: work}}
          done: {{terminal: true}}
        """,
    )
    flow = load_flow(path)
    assert flow.states["work"].policy.on_exhausted == "review"
    # without the on_exhausted edge, review is unreachable
    bad = path.read_text().replace("on_exhausted: review", "on_exhausted: failed")
    assert any("'review' is unreachable" in e for e in errors(tmp_path, bad))
