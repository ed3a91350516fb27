"""The fault model, in one place: what an attempt's outcome does to its instance.

Given the state's :class:`~runner.flowspec.policy.Policy` and the instance's counters in
that state (the times of its errors, its restarts), each function returns a
:class:`Verdict`: the status and due time that follow, the counters after, and the reason
text an instance keeps in ``last_error``. Pure (no I/O, no clock): the worker
(``runner.engine.outcomes``), the recovery of lost attempts
(``runner.store.leases.recover_lost``), the replay of ``flowrun explain``
(``runner.ops.explain``) and its forecast (``runner.ops.forecast``) all call these, so
changing a rule here changes what the worker does and what ``explain`` says together.

The rules:

- not yet: due again after the state's ``try_interval``; nothing spent (Stator);
- sleep: ``sleeping`` until the handler's time (Metafora's ``Sleep``); nothing spent; a
  time already past is due at once;
- error: one error in the state's sliding window (Metafora's DefaultErrHandler); with
  budget left the instance sleeps for the backoff (``Backoff.delay``); with the budget
  spent it goes to ``on_exhausted`` (``failed``, ``paused`` or a state);
- timeout, missed keepalive, lost attempt: a restart (majordomo), run again at once from
  the last checkpoint, no error budget spent, until ``max_restarts`` is spent, then
  ``failed``;
- success (a move): the target state's counters start afresh
  (``runner.lifecycle.enter_state``).

Not here, on purpose: a lost attempt found when an operator command arrives
(``runner.ops.commands``: its holder's lease had expired, nobody recovered it yet). The
command's own outcome wins: the instance gets the status and due time the operator asked
for (``kill``, ``pause``, ``resume``, ``retry``, ``send``, ``sleep``, ``wake``), so no
verdict is taken from :func:`restart` (which would fail an instance whose restarts are
spent, against a ``resume`` or a ``retry``); the command path only records the attempt
``lost`` and counts the restart (the state's too when the instance stays in its state).

Every function takes the state's counters as ``errors`` (the times of its errors, epoch
s; a list, returned as is when nothing is spent) and ``restarts`` (its restarts so far),
then ``at``, the time of the outcome. Times are float epoch seconds, UTC.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import lifecycle
from runner.flowspec.policy import Policy


@dataclass(slots=True)
class Verdict:
    """What one outcome does to an instance.

    Attributes:
        status: the status after (``runnable``, ``sleeping``, ``failed``, ``paused``);
            when ``enter`` is set, the caller enters that state instead
            (``runner.lifecycle.enter_state`` gives its status).
        due_at: when the instance is next due (epoch s), ``None`` for not scheduled.
        state_errors: the error times (epoch s) that count in the state's window after.
        state_restarts: the state's restarts after.
        event: the ``runner.lifecycle`` event that made ``status`` (``backoff``,
            ``exhaust_fail``, ``exhaust_pause``, ``fail``, ``sleep``), ``None`` for none.
        enter: the state ``on_exhausted`` names, to enter now; else ``None``.
        backoff: *n* when the instance sleeps for its *n*-th backoff; else ``None``.
        spent: what was spent, e.g. ``"restarts spent (3 > max_restarts 2)"``; else ``None``.
        reason: the instance's ``last_error`` after (the attempt's error, led by ``spent``).
    """

    status: str
    due_at: float | None
    state_errors: list[float]
    state_restarts: int
    event: str | None = None
    enter: str | None = None
    backoff: int | None = None
    spent: str | None = None
    reason: str | None = None

    def columns(self) -> dict[str, Any]:
        """The instance columns this verdict sets: ``status``, ``due_at``,
        ``state_errors``, ``state_restarts``, ``last_error``."""
        return {
            "status": self.status,
            "due_at": self.due_at,
            "state_errors": self.state_errors,
            "state_restarts": self.state_restarts,
            "last_error": self.reason,
        }


def not_yet(policy: Policy, errors: list[float], restarts: int, at: float) -> Verdict:
    """A handler's "not yet" at ``at``: due after ``try_interval``, nothing spent.

    ``errors`` and ``restarts`` are the state's counters (kept). Raises nothing."""
    return Verdict("runnable", at + policy.try_interval, errors, restarts)


def sleep(errors: list[float], restarts: int, at: float, until: float | None) -> Verdict:
    """A handler's request to sleep until ``until`` (epoch s; ``None`` or a past time:
    due at once), made at ``at``; nothing spent. Raises nothing."""
    if until is not None and until > at:
        return Verdict(lifecycle.check("runnable", "sleep"), until, errors, restarts, "sleep")
    return Verdict("runnable", at, errors, restarts)


def error(
    policy: Policy,
    errors: list[float] | None,
    restarts: int,
    at: float,
    text: str | None,
    rand: Callable[[], float] = random.random,
) -> Verdict:
    """An error at ``at`` with the state's earlier error times ``errors`` (epoch s).

    The error joins those still in the window; with fewer than ``max_errors`` there the
    instance sleeps for the backoff (``rand`` draws the jitter), else the budget is spent
    and ``on_exhausted`` decides: ``failed``, ``paused``, or a state to enter. ``text`` is
    the attempt's error. Raises nothing.
    """
    window = lifecycle.in_window(errors, at, policy.window)
    window.append(at)
    n = len(window)
    if n < policy.max_errors:
        due = at + policy.backoff.delay(n, rand)
        status = lifecycle.check("runnable", "backoff")
        return Verdict(status, due, window, restarts, "backoff", backoff=n, reason=text)
    spent = f"error budget spent ({n} errors in {policy.window:g}s)"
    reason = f"{spent}: {text}"
    target = policy.on_exhausted
    if target in ("failed", "paused"):
        event = "exhaust_fail" if target == "failed" else "exhaust_pause"
        status = lifecycle.check("runnable", event)
        return Verdict(status, None, window, restarts, event, spent=spent, reason=reason)
    return Verdict("runnable", at, window, restarts, enter=target, spent=spent, reason=reason)


def restart(
    policy: Policy | None,
    errors: list[float],
    restarts: int,
    at: float,
    text: str | None,
    status: str = "runnable",
) -> Verdict:
    """A timeout, a missed keepalive or a lost attempt at ``at``: one restart of the state
    (``restarts`` is the count before), no error budget spent.

    Within ``max_restarts`` the instance runs again at once (from its last checkpoint);
    past it the instance ``fail``s. ``status`` is the instance's status when the attempt
    is recorded (``runnable`` for the worker's own; a lost attempt found later may belong
    to an instance an operator put to sleep meanwhile: it counts the restart and keeps
    that status and its stored due time, ``due_at`` ``None`` here, as the operator
    commands do with such an attempt). ``text`` is the attempt's error. A ``policy`` of
    ``None`` (its flow version no longer compiles) allows no restart. Raises nothing.
    """
    used = restarts + 1
    limit = policy.max_restarts if policy is not None else 0
    if status != "runnable" and not lifecycle.allowed(status, "fail"):  # not runnable: kept
        return Verdict(status, None, errors, used, reason=text)
    if used <= limit:
        return Verdict(status, at, errors, used, reason=text)
    spent = f"restarts spent ({used} > max_restarts {limit})"
    failed = lifecycle.check(status, "fail")
    return Verdict(failed, None, errors, used, "fail", spent=spent, reason=f"{spent}; last: {text}")
