"""Turn one attempt's result into the instance's next row, by the fault model.

What each outcome does to the instance (the error budget, the backoff, the restarts, the
try interval, a handler's sleep) is decided in one place, ``runner.flowspec.faults``; this
module applies its verdict to the claim's row. Pure (no I/O), so it is tested directly:

- moved → the target, checked against the flow's compiled ``transitions`` machine; an
  illegal target is an *error* with a clear text, never a crash;
- not yet, sleep, error, timeout / missed keepalive / lost (the worker's self-fence) →
  ``faults.not_yet``, ``faults.sleep``, ``faults.error``, ``faults.restart``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner import lifecycle
from runner.errors import IllegalMove
from runner.flowspec import faults
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
    durable_data: dict[str, Any],
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
    values: dict[str, Any] = {
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
        assert to_state is not None  # a move names its target (AttemptResult)
        try:
            check_move(flow, claim.state, to_state)
        except IllegalMove as exc:
            outcome, error, to_state = "error", str(exc), None
        else:
            values.update(lifecycle.enter_state(flow, to_state, at, result.data, claim.route_event))
            values["data"] = result.data
            if values["status"] == "completed":
                lifecycle.check("runnable", "complete")
    verdict = None  # moved: the target's counters start afresh (lifecycle.enter_state)
    if outcome == "not_yet":
        values["data"] = result.data
        verdict = faults.not_yet(policy, claim.state_errors, claim.state_restarts, at)
    elif outcome == "sleep":
        values["data"] = result.data
        verdict = faults.sleep(claim.state_errors, claim.state_restarts, at, result.sleep_until)
    elif outcome == "error":
        values["errors"] += 1
        verdict = faults.error(policy, claim.state_errors, claim.state_restarts, at, error, rand)
    elif outcome in ("timeout", "lost"):  # lost: ended by the worker's self-fence
        values["restarts"] += 1
        verdict = faults.restart(policy, claim.state_errors, claim.state_restarts, at, error)
    if verdict is not None:
        values.update(verdict.columns())
        if verdict.enter is not None:
            values.update(
                lifecycle.enter_state(flow, verdict.enter, at, values["data"], claim.route_event)
            )
    if values["state_changed"] is not None and flow.has_deadlines:
        values["deadline_flow"] = flow  # the commit sets its deadline (store.deadlines)
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
            "log_bytes": result.log_bytes,
        },
    )
