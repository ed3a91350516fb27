"""Turn one attempt's result into the instance's next row: the fault model's policy.

Pure functions (no I/O), so every rule is tested directly:

- moved → the target, checked against the flow's compiled ``transitions`` machine; an
  illegal target is an *error* with a clear text, never a crash;
- not yet → due again after the state's ``try_interval``; nothing spent (Stator);
- sleep → ``sleeping`` in the same state until the handler's time (Metafora's ``Sleep``);
  nothing spent; a time already past is due at once;
- error → one error in the state's sliding window (Metafora's DefaultErrHandler: 8 in
  4 h by default); with budget left the instance sleeps for the backoff
  (``compiler.Backoff.delay``: ``initial * factor**(n-1)``, capped at ``max``, with
  full/equal/no jitter, after AWS's "Exponential Backoff and Jitter"); with the budget
  spent it goes to ``on_exhausted``;
- timeout / missed keepalive → a restart (majordomo): tried again at once from the last
  checkpoint until ``max_restarts`` is spent, then ``failed``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from runner import lifecycle
from runner.errors import IllegalMove
from runner.handlers.attempt import AttemptResult
from runner.store.rows import Claim, Outcome

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

_verdicts: dict[tuple[str, str, str], str | None] = {}


def check_move(flow: CompiledFlow, source: str, target: str) -> None:
    """``flow.check_move`` with its verdict memoised per (version, source, target).

    The compiled machine of a version never changes, so its answer for a move never
    changes either; the machine is asked once per distinct move and process.
    """
    key = (flow.version, source, target)
    if key not in _verdicts:
        try:
            flow.check_move(source, target)
            _verdicts[key] = None
        except IllegalMove as exc:
            _verdicts[key] = str(exc)
    if _verdicts[key] is not None:
        raise IllegalMove(_verdicts[key])


def decide(
    flow: CompiledFlow,
    claim: Claim,
    result: AttemptResult,
    durable_data: dict,
    at: float,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """The :class:`Outcome` of ``result`` for ``claim`` under ``flow``'s policy.

    Args:
        flow: the instance's ``CompiledFlow`` (its own version).
        claim: the claim the attempt ran under.
        result: what the executor returned (not ``cancelled``: that writes no instance row).
        durable_data: the data as last stored (claim data plus checkpoints); kept on errors.
        at: now, epoch seconds.
    """
    state = flow.states[claim.state]
    policy = state.policy
    values: dict = {
        "state": claim.state,
        "status": "runnable",
        "data": durable_data,
        "due_at": at,
        "errors": claim.errors,
        "restarts": claim.restarts,
        "state_errors": claim.state_errors,
        "state_restarts": claim.state_restarts,
        "last_error": None,
        "state_changed": None,  # None keeps the stored value (no move)
    }
    outcome, to_state, error = result.outcome, result.to_state, result.error
    if outcome == "moved":
        try:
            check_move(flow, claim.state, to_state)
        except IllegalMove as exc:
            outcome, error, to_state = "error", str(exc), None
        else:
            values.update(lifecycle.enter_state(flow, to_state, at))
            values["data"] = result.data
            if values["status"] == "completed":
                lifecycle.check("runnable", "complete")
    if outcome == "not_yet":
        values["data"] = result.data
        values["due_at"] = at + policy.try_interval
    elif outcome == "sleep":
        values["data"] = result.data
        until = result.sleep_until if result.sleep_until is not None else at
        if until > at:
            values.update(status=lifecycle.check("runnable", "sleep"), due_at=until)
    elif outcome == "error":
        _spend_error(flow, values, policy, error, at, rand)
    elif outcome in ("timeout", "lost"):  # lost: ended by the worker's self-fence
        values["restarts"] += 1
        values["state_restarts"] += 1
        values["last_error"] = error
        if values["state_restarts"] > policy.max_restarts:
            values.update(status=lifecycle.check("runnable", "fail"), due_at=None)
            values["last_error"] = (
                f"restarts spent ({values['state_restarts']} > max_restarts "
                f"{policy.max_restarts}); last: {error}"
            )
    unchanged: tuple[str, ...] = ()
    data, errors = values["data"], values["state_errors"]
    if data is claim.data or data == claim.data:
        unchanged = ("data",)
    if errors is claim.state_errors or errors == claim.state_errors:
        unchanged += ("state_errors",)
    return Outcome(
        unchanged=unchanged,
        claim=claim,
        values=values,
        attempt_values={
            "outcome": outcome,
            "to_state": to_state if outcome == "moved" else None,
            "error": error,
            "checkpoint": result.checkpoint,
        },
    )


def _spend_error(flow, values: dict, policy, error: str | None, at: float, rand) -> None:
    window = lifecycle.in_window(values["state_errors"], at, policy.window)
    window.append(at)
    values["errors"] += 1
    values["state_errors"] = window
    values["last_error"] = error
    if len(window) < policy.max_errors:
        values["status"] = lifecycle.check("runnable", "backoff")
        values["due_at"] = at + policy.backoff.delay(len(window), rand)
        return
    spent = f"error budget spent ({len(window)} errors in {policy.window:g}s): {error}"
    target = policy.on_exhausted
    if target == "failed":
        values.update(status=lifecycle.check("runnable", "exhaust_fail"), due_at=None)
    elif target == "paused":
        values.update(status=lifecycle.check("runnable", "exhaust_pause"), due_at=None)
    else:
        values.update(lifecycle.enter_state(flow, target, at))
    values["last_error"] = spent
