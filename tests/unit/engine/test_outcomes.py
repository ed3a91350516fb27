"""The fault model's policy (``runner.engine.outcomes.decide``), one outcome kind at a time.

``decide`` is pure: each test compiles a real flow file, builds the claim the worker would
hold and the result the executor would return, and checks the instance columns and the
attempt row it asks to write. Backoff math uses a fixed ``rand``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engine.outcomes import decide
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.policy import Backoff
from runner.handlers.attempt import AttemptResult
from runner.store.rows import Claim
from tests.support.fault import load, write_flow

AT = 1_000_000.0

FLOW = """\
initial: work
defaults:
  try_interval: 7s
  error_budget: {max_errors: 3, window: 1h}
  backoff: {initial: 10s, factor: 2, max: 25s, jitter: none}
  max_restarts: 2
states:
  work:
    exec: [python, -c, "pass"]
    next: check
    to: [side]
  check:
    exec: [python, -c, "pass"]
    next: done
    error_budget: {max_errors: 2, on_exhausted: paused}
  side:
    exec: [python, -c, "pass"]
    next: done
    to: [rescue]  # the compiler does not count on_exhausted as an edge for reachability
    error_budget: {max_errors: 1, on_exhausted: rescue}
  rescue: {external: true, on: {again: work}}
  done: {terminal: true}
"""


@pytest.fixture
def flow(tmp_path: Path) -> CompiledFlow:
    return load(write_flow(tmp_path, "oc", FLOW))


def claim(state: str = "work", *, errors: list[float] | None = None, restarts: int = 0) -> Claim:
    """The claim a worker would hold for an instance in ``state``."""
    errs = list(errors or [])
    return Claim(
        id=1,
        flow="oc",
        version="v",
        state=state,
        data={"n": 1},
        fence=5,
        attempt=3,
        errors=len(errs) + 10,
        restarts=restarts + 20,
        state_errors=errs,
        state_restarts=restarts,
        event_id=None,
    )


DURABLE = {"n": 1, "saved": True}


def test_moved_along_next(flow: CompiledFlow) -> None:
    c = claim(errors=[AT - 5], restarts=1)
    out = decide(flow, c, AttemptResult("moved", {"n": 2}, to_state="check"), DURABLE, AT)
    v = out.values
    assert (v["state"], v["status"], v["due_at"], v["state_changed"]) == (
        "check",
        "runnable",
        AT,
        AT,
    )
    assert v["data"] == {"n": 2}, "a move commits the handler's data"
    assert (v["state_errors"], v["state_restarts"]) == ([], 0), "a new state starts fresh"
    assert (v["errors"], v["restarts"]) == (c.errors, c.restarts)
    assert out.attempt_values["outcome"] == "moved"
    assert out.attempt_values["to_state"] == "check"
    assert (out.instance_id, out.attempt, out.fence) == (1, 3, 5)


def test_moved_to_terminal_completes(flow: CompiledFlow) -> None:
    out = decide(flow, claim("check"), AttemptResult("moved", {}, to_state="done"), DURABLE, AT)
    assert (out.values["status"], out.values["due_at"]) == ("completed", None)


def test_moved_to_external_waits_for_an_event(flow: CompiledFlow) -> None:
    out = decide(flow, claim("side"), AttemptResult("moved", {}, to_state="rescue"), DURABLE, AT)
    assert (out.values["state"], out.values["status"], out.values["due_at"]) == (
        "rescue",
        "runnable",
        None,
    )


def test_illegal_move_is_an_error_with_clear_text(flow: CompiledFlow) -> None:
    out = decide(flow, claim(), AttemptResult("moved", {"n": 9}, to_state="done"), DURABLE, AT)
    assert out.attempt_values["outcome"] == "error"
    assert out.attempt_values["to_state"] is None
    err = out.attempt_values["error"]
    assert "state 'work' cannot go to 'done'" in err and "allowed: check, side" in err
    v = out.values
    assert (v["state"], v["status"]) == ("work", "sleeping")
    assert v["errors"] == claim().errors + 1 and v["state_errors"] == [AT]
    assert v["data"] == DURABLE, "an error keeps the data as last stored"

    unknown = decide(flow, claim(), AttemptResult("moved", {}, to_state="nowhere"), DURABLE, AT)
    assert "'nowhere' (no such state)" in unknown.attempt_values["error"]


def test_not_yet_waits_try_interval_and_spends_nothing(flow: CompiledFlow) -> None:
    c = claim(errors=[AT - 1])
    out = decide(flow, c, AttemptResult("not_yet", {"n": 3}), DURABLE, AT)
    v = out.values
    assert (v["state"], v["status"], v["due_at"]) == ("work", "runnable", AT + 7)
    assert v["data"] == {"n": 3}
    assert (v["errors"], v["state_errors"], v["restarts"]) == (c.errors, [AT - 1], c.restarts)
    assert v["state_changed"] is None, "no move: state_changed kept"
    assert out.attempt_values == {
        "outcome": "not_yet",
        "to_state": None,
        "error": None,
        "checkpoint": None,
        "log_bytes": None,
    }
    written = AttemptResult("not_yet", {"n": 3}, log_bytes=12)
    assert decide(flow, c, written, DURABLE, AT).attempt_values["log_bytes"] == 12


def test_error_with_budget_left_sleeps_for_the_backoff(flow: CompiledFlow) -> None:
    first = decide(flow, claim(), AttemptResult("error", {"x": 1}, error="boom"), DURABLE, AT)
    v = first.values
    assert (v["status"], v["due_at"], v["last_error"]) == ("sleeping", AT + 10, "boom")
    assert v["data"] == DURABLE
    second = decide(
        flow, claim(errors=[AT - 100]), AttemptResult("error", {}, error="boom"), DURABLE, AT
    )
    assert second.values["due_at"] == AT + 20  # 10 * 2 ** 1
    assert second.values["state_errors"] == [AT - 100, AT]
    assert second.attempt_values["outcome"] == "error"
    assert second.attempt_values["error"] == "boom"


def test_errors_outside_the_window_do_not_count(flow: CompiledFlow) -> None:
    old = [AT - 3601, AT - 3700]  # window 1h: both expired
    out = decide(flow, claim(errors=old), AttemptResult("error", {}, error="e"), DURABLE, AT)
    assert out.values["status"] == "sleeping"
    assert out.values["state_errors"] == [AT]
    assert out.values["due_at"] == AT + 10, "backoff restarts from the first delay"


def test_budget_spent_fails_by_default(flow: CompiledFlow) -> None:
    c = claim(errors=[AT - 20, AT - 10])
    out = decide(flow, c, AttemptResult("error", {}, error="disk full"), DURABLE, AT)
    v = out.values
    assert (v["status"], v["due_at"]) == ("failed", None)
    assert v["last_error"].startswith("error budget spent (3 errors in 3600s)")
    assert v["last_error"].endswith("disk full")
    assert v["errors"] == c.errors + 1


def test_budget_spent_pauses(flow: CompiledFlow) -> None:
    out = decide(
        flow, claim("check", errors=[AT - 1]), AttemptResult("error", {}, error="e"), DURABLE, AT
    )
    assert (out.values["state"], out.values["status"], out.values["due_at"]) == (
        "check",
        "paused",
        None,
    )


def test_budget_spent_moves_to_a_named_state(flow: CompiledFlow) -> None:
    out = decide(flow, claim("side"), AttemptResult("error", {}, error="e"), DURABLE, AT)
    v = out.values
    assert (v["state"], v["status"], v["due_at"]) == ("rescue", "runnable", None)
    assert v["state_errors"] == [] and v["data"] == DURABLE
    assert "error budget spent" in v["last_error"]


def test_timeout_is_a_restart_from_the_checkpoint(flow: CompiledFlow) -> None:
    c = claim(restarts=1)
    res = AttemptResult(
        "timeout", {"half": "done", "n": 5}, error="timeout (3s)", checkpoint={"saved": True}
    )
    out = decide(flow, c, res, DURABLE, AT)
    v = out.values
    assert (v["status"], v["due_at"]) == ("runnable", AT), "tried again at once"
    assert v["data"] == DURABLE, "the next attempt starts from the last checkpointed data"
    assert (v["restarts"], v["state_restarts"]) == (c.restarts + 1, 2)
    assert (v["errors"], v["state_errors"]) == (c.errors, []), "a restart spends no error"
    assert out.attempt_values["outcome"] == "timeout"
    assert out.attempt_values["checkpoint"] == {"saved": True}


def test_restarts_spent_fail(flow: CompiledFlow) -> None:
    out = decide(
        flow, claim(restarts=2), AttemptResult("timeout", {}, error="missed keepalive"), DURABLE, AT
    )
    v = out.values
    assert (v["status"], v["due_at"], v["state_restarts"]) == ("failed", None, 3)
    assert "restarts spent (3 > max_restarts 2)" in v["last_error"]
    assert "missed keepalive" in v["last_error"]


@pytest.mark.parametrize(
    ("jitter", "n", "rand", "expected"),
    [
        ("none", 1, 0.5, 10.0),
        ("none", 2, 0.5, 20.0),
        ("none", 3, 0.5, 25.0),  # 40 capped at max
        ("none", 30, 0.5, 25.0),
        ("full", 2, 0.25, 5.0),  # uniform in [0, 20]
        ("full", 2, 0.0, 0.0),
        ("equal", 2, 0.0, 10.0),  # 20/2 + [0, 10]
        ("equal", 2, 1.0, 20.0),
        ("equal", 3, 0.5, 18.75),  # 25/2 + 25/2 * 0.5
    ],
)
def test_backoff_math(jitter: str, n: int, rand: float, expected: float) -> None:
    b = Backoff(initial=10.0, factor=2.0, max=25.0, jitter=jitter)
    assert b.delay(n, lambda: rand) == pytest.approx(expected)


def test_decide_uses_the_given_rand(tmp_path: Path) -> None:
    f = load(
        write_flow(
            tmp_path,
            "jit",
            FLOW.replace("jitter: none", "jitter: full"),
        )
    )
    out = decide(f, claim(), AttemptResult("error", {}, error="e"), DURABLE, AT, rand=lambda: 0.3)
    assert out.values["due_at"] == pytest.approx(AT + 3.0)
