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


def test_waits_have_causes_and_the_budget_refills(tmp_path: Path) -> None:
    flow = load(write_flow(tmp_path, "ex", FLOW))
    instance = {
        "id": 9,
        "flow": "ex",
        "version": flow.version,
        "state": "rescue",
        "status": "runnable",
        "due_at": None,
        "attempts": 6,
        "errors": 3,
        "restarts": 1,
        "state_restarts": 0,
        "state_errors": [],
        "running_attempt": None,
        "locked_by": None,
        "locked_until": None,
        "last_error": "error budget spent",
        "created_at": T0,
        "event_id": None,
    }
    rows = {
        "instance": instance,
        "attempts": [
            _attempt(1, T0 + 1, T0 + 2, "not_yet"),
            _attempt(2, T0 + 32, T0 + 33, "error", "boom\ntrace"),
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
    assert "error: boom" in " ".join(texts) and "trace" not in " ".join(texts)
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
