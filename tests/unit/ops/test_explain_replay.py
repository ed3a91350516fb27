"""``runner.ops.explain.explain`` is pure: a compiled flow and hand-written rows (as
``detail.instance_rows`` returns them) give a timeline whose waits have their causes."""

from __future__ import annotations

from pathlib import Path

from runner.ops.explain import explain
from runner.ops.explanation import render_text
from tests.support.fault import load, write_flow

T0 = 1_800_000_000.0
FLOW = """\
initial: work
defaults:
  try_interval: 30s
  error_budget: {max_errors: 2, window: 10m, on_exhausted: rescue}
  backoff: {initial: 4s, factor: 3, max: 1m, jitter: equal}
  max_restarts: 1
states:
  work: {exec: [python, -c, "pass"], next: done, to: [rescue]}
  rescue: {external: true, on: {again: work}}
  done: {terminal: true}
"""


def _attempt(n, start, end, outcome, error=None, to=None, state="work"):
    return {
        "attempt": n,
        "state": state,
        "worker": "w1",
        "started_at": start,
        "finished_at": end,
        "outcome": outcome,
        "to_state": to,
        "error": error,
        "checkpoint": None,
    }


def _instance(version: str, **values) -> dict:
    """An instance row of flow ``ex`` at ``version`` (``values`` replace the defaults)."""
    row = {
        "id": 9,
        "flow": "ex",
        "version": version,
        "state": "work",
        "status": "runnable",
        "due_at": None,
        "attempts": 0,
        "errors": 0,
        "restarts": 0,
        "state_restarts": 0,
        "state_errors": [],
        "running_attempt": None,
        "locked_by": None,
        "locked_until": None,
        "last_error": None,
        "created_at": T0,
        "event_id": None,
    }
    return {**row, **values}


def test_waits_have_causes_and_the_budget_refills(tmp_path: Path) -> None:
    flow = load(write_flow(tmp_path, "ex", FLOW))
    instance = _instance(
        flow.version,
        state="rescue",
        attempts=6,
        errors=3,
        restarts=1,
        last_error="error budget spent",
    )
    rows = {
        "instance": instance,
        "attempts": [
            _attempt(1, T0 + 1, T0 + 2, "not_yet"),
            _attempt(2, T0 + 32, T0 + 33, "error", "exit code 1: trace\nboom"),
            _attempt(3, T0 + 36, T0 + 100, "lost", "lost: worker w1 stopped"),
            _attempt(4, T0 + 101, T0 + 102, "cancelled", "paused"),
            _attempt(5, T0 + 800, T0 + 801, "error", "boom again"),
            _attempt(6, T0 + 900, T0 + 901, "error", "third"),
        ],
        "commands": [
            {
                "command": "pause",
                "args": {},
                "source": "cli",
                "created_at": T0 + 101.5,
                "status": "applied",
                "result": "instance 9: runnable -> paused",
            },
            {
                "command": "resume",
                "args": {},
                "source": "rule:ex#1",
                "created_at": T0 + 790,
                "status": "applied",
                "result": "instance 9: paused -> runnable",
            },
        ],
        "event": None,
    }
    result = explain(rows, lambda v: flow, T0 + 1000)
    texts = [e.text for e in result.timeline]
    waits = [e for e in result.timeline if e.kind == "wait"]
    causes = [w.data["cause"]["kind"] for w in waits]
    assert causes == ["created", "try_interval", "backoff", "lost", "command", "backoff"]
    backoff = waits[2].data["cause"]
    assert (backoff["n"], backoff["low"], backoff["high"]) == (1, 2.0, 4.0)
    assert "backoff 1: 4s, equal jitter: a delay drawn from 2s to 4s" in waits[2].text
    assert "restart 1 of 1 (no error budget spent)" in " ".join(texts)
    assert any("budget refilled: an error left the 10m window" in t for t in texts)
    assert "resume by rule ex#1" in " ".join(texts)
    # the error line: the head and the last line of the kept output
    assert "error: exit code 1: boom" in " ".join(texts) and "trace" not in " ".join(texts)
    spent = [t for t in texts if "budget is spent" in t]
    assert spent == [
        "error 2 of 2 in 10m: the error budget is spent; the instance moves to state "
        "'rescue' (on_exhausted: rescue)"
    ]
    due = result.forecast[0]
    assert "`flowrun send 9 again` (→ work)" in due.text
    assert len(result.forecast) == 1  # an external state: no error, no restart to forecast
    text = render_text(result, T0 + 1000)
    assert text.splitlines()[0].startswith("instance 9 of flow ex: state 'rescue'")


def _command(name, at, result, **args):
    return {
        "command": name,
        "args": args,
        "source": "cli",
        "created_at": at,
        "status": "applied",
        "result": result,
    }


def test_an_attempt_cancelled_by_a_command_waits_for_the_command(tmp_path: Path) -> None:
    # the worker records the cancelled attempt after it noticed the command (its poll
    # interval later): the wait after it is the command's, not "the attempt was cancelled"
    # (CI failed test_sleep.py::test_operator_sleep_and_wake when a `flowrun sleep` landed
    # while an attempt ran)
    flow = load(write_flow(tmp_path, "ex", FLOW))
    instance = _instance(flow.version, status="sleeping", due_at=T0 + 3600, attempts=2)
    cancelled = "cancelled: the instance was paused, killed, moved or taken over"
    rows = {
        "instance": instance,
        "attempts": [
            _attempt(1, T0 + 1, T0 + 2.2, "cancelled", cancelled),
            _attempt(2, T0 + 10, T0 + 10.2, "cancelled", cancelled),
        ],
        "commands": [
            _command("pause", T0 + 2, "instance 9: runnable -> paused"),
            _command("resume", T0 + 9, "instance 9: paused -> runnable"),
            _command("sleep", T0 + 10.1, "instance 9: runnable -> sleeping", until=T0 + 3600),
        ],
        "event": None,
    }
    result = explain(rows, lambda v: flow, T0 + 20)
    assert result.forecast[0].data["why"] == "put to sleep by cli (nothing spent)"
    assert "sleeping until" in result.forecast[0].text
    waits = [e for e in result.timeline if e.kind == "wait"]
    # the wait before attempt 2: the resume (the pause happened while it was cancelled)
    assert waits[-1].data["cause"] == {"kind": "command", "command": "resume"}
    text = render_text(result, T0 + 20)
    assert "sleep by cli" in text and "put to sleep by cli" in text
    # a worker stopping (no command while the attempt ran) is still the cause
    rows["attempts"] = rows["attempts"][:1] + [
        _attempt(2, T0 + 10, T0 + 10.05, "cancelled", "cancelled: worker stopping")
    ]
    rows["commands"] = rows["commands"][:2]
    instance.update(status="runnable", due_at=T0 + 10.05)
    why = explain(rows, lambda v: flow, T0 + 20).forecast[0].data["why"]
    assert why.startswith("the attempt was cancelled")
