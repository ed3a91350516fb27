"""Deadlines' pure rules (``runner.flowspec.deadlines``) on compiled flows, and what
``flowrun check`` says of a wrong one."""

from __future__ import annotations

import pytest

from runner.errors import FlowErrors
from runner.flowspec import deadlines
from runner.flowspec.compiler import compile_source

FLOW = """\
flow: d
initial: wait
{flow_deadline}
states:
  wait:
    external: true
    on: {{ok: done, up: escalate}}
    deadline: {state_deadline}
  escalate:
    external: true
    on: {{ok: done}}
  done: {{terminal: true}}
"""


def flow(state_deadline: str, flow_deadline: str = ""):
    return compile_source(
        FLOW.format(state_deadline=state_deadline, flow_deadline=flow_deadline), "d.yaml"
    )


def test_a_state_deadline_counts_from_entry_and_moves() -> None:
    f = flow("{after: 2s, then: escalate}")
    assert f.has_deadlines and f.states["wait"].deadline == deadlines.Deadline(
        2.0, "entered", "escalate"
    )
    assert deadlines.on_entry(f, "wait", 100.0, 50.0) == 102.0
    assert deadlines.missed(f, "wait", 100.0, 50.0, 102.0, 101.9).misses == []
    fired = deadlines.missed(f, "wait", 100.0, 50.0, 102.0, 102.5)
    assert [(m.due, m.state, m.deadline.then) for m in fired.misses] == [
        (102.0, "wait", "escalate")
    ]
    assert (fired.state, fired.entered, fired.status, fired.next_at) == (
        "escalate",
        102.5,
        None,
        None,
    )


def test_alert_fires_once_and_moves_nothing() -> None:
    f = flow("{after: 10s, then: alert}")
    fired = deadlines.missed(f, "wait", 0.0, 0.0, 10.0, 11.0)
    assert len(fired.misses) == 1 and fired.state is None and fired.status is None
    assert fired.next_at is None  # nothing left: the alert does not fire again


def test_the_flow_deadline_counts_from_creation_across_states() -> None:
    f = flow("{after: 10s, then: escalate}", "deadline: {after: 30s, then: failed}")
    assert f.deadline == deadlines.Deadline(30.0, "created", "failed", "flow")
    assert deadlines.on_entry(f, "wait", 0.0, 0.0) == 10.0
    moved = deadlines.missed(f, "wait", 0.0, 0.0, 10.0, 10.0)
    assert moved.state == "escalate" and moved.next_at == 30.0  # the flow's still pends
    failed = deadlines.missed(f, "escalate", 10.0, 0.0, 30.0, 31.0)
    assert failed.status == "failed" and failed.next_at is None
    assert [m.deadline.scope for m in failed.misses] == ["flow"]
    # both due in one look: the state's moves, then the flow's fails it
    both = deadlines.missed(f, "wait", 0.0, 0.0, 10.0, 40.0)
    assert [m.deadline.scope for m in both.misses] == ["state", "flow"]
    assert (both.state, both.status) == ("escalate", "failed")
    # a state entered after the flow's deadline passed (acted on): only its own counts
    assert deadlines.on_entry(f, "escalate", 40.0, 0.0) is None
    # ... unless the stored one is past and not acted on yet: it is kept
    assert deadlines.on_entry(f, "escalate", 40.0, 0.0, stored=30.0) == 30.0
    assert deadlines.missed(f, "escalate", 40.0, 0.0, 30.0, 40.5).status == "failed"


def test_alert_then_the_flow_deadline_later() -> None:
    f = flow("{after: 10s, then: alert}", "deadline: {after: 30s, then: paused}")
    first = deadlines.missed(f, "wait", 0.0, 0.0, 10.0, 12.0)
    assert len(first.misses) == 1 and first.next_at == 30.0
    second = deadlines.missed(f, "wait", 0.0, 0.0, first.next_at, 31.0)
    assert [m.deadline.scope for m in second.misses] == ["flow"]
    assert second.status == "paused" and second.next_at is None


def test_since_created_on_a_state() -> None:
    f = flow("{after: 10s, since: created, then: alert}")
    assert deadlines.on_entry(f, "wait", 5.0, 0.0) == 10.0
    assert deadlines.on_entry(f, "wait", 50.0, 0.0) == 10.0  # already past: due at once


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{after: 2s, then: escalat}", "deadline then 'escalat' must be a state"),
        ("{after: 0s, then: alert}", "greater than 0"),
        ("{after: 2s, then: alert, since: whenever}", "since"),
    ],
)
def test_check_reports_a_wrong_deadline_with_its_position(text: str, message: str) -> None:
    with pytest.raises(FlowErrors) as caught:
        flow(text)
    [err] = caught.value.errors
    assert message in err.message and err.line == 8, err


def test_check_refuses_a_flow_deadline_since_entered_and_a_terminal_deadline() -> None:
    with pytest.raises(FlowErrors) as caught:
        flow("{after: 2s, then: alert}", "deadline: {after: 1h, since: entered, then: failed}")
    assert "since must be created" in str(caught.value)
    source = FLOW.format(state_deadline="{after: 1s, then: alert}", flow_deadline="").replace(
        "done: {terminal: true}", "done: {terminal: true, deadline: {after: 1s, then: alert}}"
    )
    with pytest.raises(FlowErrors) as caught:
        compile_source(source, "d.yaml")
    assert "a terminal state has no deadline" in str(caught.value)


def test_a_state_reached_only_by_a_deadline_is_reachable() -> None:
    source = FLOW.format(state_deadline="{after: 2s, then: escalate}", flow_deadline="")
    assert "escalate" in compile_source(source.replace(", up: escalate", ""), "d.yaml").states


def test_a_deadline_that_moves_leaves_a_state_an_alert_does_not() -> None:
    lone = "initial: wait\nstates:\n  wait:\n    external: true\n    deadline: THEN\n"
    lone += "  late: {terminal: true}\n"
    moving = lone.replace("THEN", "{after: 2s, then: late}")
    assert compile_source(moving, "d.yaml").states["wait"].deadline is not None
    with pytest.raises(FlowErrors) as caught:
        compile_source(lone.replace("THEN", "{after: 2s, then: alert}"), "d.yaml")
    assert "state 'wait' has no next:, to: or on: (it could never be left)" in str(caught.value)
