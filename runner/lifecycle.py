"""The status lifecycle of an instance, compiled with ``transitions`` from one table.

Source: Metafora's statemachine ``Rules`` table (see ``docs/sources.md``)
and DefaultErrHandler, adapted: ``fault`` is not a stored status (an error either sleeps
for the backoff or spends the budget at once), and ``retry`` revives a failed instance.

Every status change the engine or an operator makes goes through :func:`check`, so a
refused move is one clear message, never a half-written row.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from runner.errors import IllegalMove
from runner.labels import resolve

if TYPE_CHECKING:
    from transitions import Machine


#: The fixed lifecycle statuses of an instance (Metafora's states, minus ``fault``).
STATUSES = ("runnable", "sleeping", "paused", "completed", "failed", "killed")

#: Outcomes of one attempt.
OUTCOMES = ("moved", "not_yet", "sleep", "error", "timeout", "lost", "cancelled")


#: (event, sources, destination). The single source of truth for status moves.
TABLE: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("pause", ("runnable", "sleeping"), "paused"),
    ("resume", ("paused", "sleeping"), "runnable"),
    ("sleep", ("runnable", "paused", "sleeping"), "sleeping"),  # a handler or `flowrun sleep`
    ("wake", ("sleeping",), "runnable"),  # due time reached: the worker claims it
    ("backoff", ("runnable",), "sleeping"),  # an error with budget left
    ("exhaust_fail", ("runnable",), "failed"),  # budget spent, on_exhausted: failed
    ("exhaust_pause", ("runnable",), "paused"),  # budget spent, on_exhausted: paused
    ("complete", ("runnable",), "completed"),  # entered a terminal state
    ("fail", ("runnable",), "failed"),  # restarts spent
    ("expire", ("runnable", "sleeping", "paused"), "failed"),  # a deadline with then: failed
    ("kill", ("runnable", "sleeping", "paused"), "killed"),
    ("retry", ("failed",), "runnable"),
    ("send", ("runnable", "sleeping", "paused"), "runnable"),  # an `on:` event moved it
)

#: Operator commands (a subset of the events above, plus ``send``).
OPERATOR_COMMANDS = ("pause", "resume", "kill", "retry", "send", "sleep", "wake")


@functools.cache
def machine() -> Machine:
    """The status machine compiled with ``transitions`` from :data:`TABLE` (built on first
    use, so a command that only needs :data:`STATUSES` does not import ``transitions``)."""
    from transitions import Machine

    m = Machine(model=None, states=list(STATUSES), initial=None, auto_transitions=False)
    for event, sources, dest in TABLE:
        m.add_transition(event, list(sources), dest)
    return m


_verdicts: dict[tuple[str, str], str] = {}


class _Probe:
    __slots__ = ("state",)

    def __init__(self, state: str) -> None:
        self.state = state


def allowed(status: str, event: str) -> bool:
    """True when ``event`` may fire from ``status``."""
    ev = machine().events.get(event)
    return ev is not None and status in ev.transitions


def check(status: str, event: str, instance_id: int | None = None) -> str:
    """Return the status after ``event`` fires from ``status``.

    Raises ``IllegalMove`` with an operator-readable text, e.g.
    ``"cannot resume: instance 42 is completed"``.
    """
    known = _verdicts.get((status, event))
    if known is not None:
        return known
    ev = machine().events.get(event)
    if ev is None:
        raise IllegalMove(f"unknown command {event!r} (expected one of: {', '.join(events())})")
    probe = _Probe(status)
    from transitions import MachineError

    try:
        ev.trigger(probe)
    except MachineError:
        who = f"instance {instance_id}" if instance_id is not None else "the instance"
        raise IllegalMove(f"cannot {event}: {who} is {status}") from None
    _verdicts[(status, event)] = probe.state  # the table never changes: ask the machine once
    return probe.state


def events() -> list[str]:
    """Every event name of the lifecycle table, in table order."""
    return [e for e, _, _ in TABLE]


def sources(event: str) -> tuple[str, ...]:
    """The statuses ``event`` may fire from (empty for an unknown event)."""
    return next((src for e, src, _ in TABLE if e == event), ())


def in_window(error_times: list[float] | None, now: float, window: float | None) -> list[float]:
    """The error timestamps (epoch s) that still count against the error budget at ``now``:
    those younger than ``window`` seconds (all of them when the window is unknown).

    The one definition of the sliding window (Metafora's DefaultErrHandler), used by the
    worker when it spends budget and by everything that shows what is left.
    """
    if window is None:
        return list(error_times or [])
    return [t for t in error_times or [] if t > now - window]


def budget(
    error_times: list[float] | None, now: float, policy: Any, restarts: int
) -> dict[str, Any]:
    """The error budget of a state under ``policy`` (a ``runner.flowspec.policy.Policy``;
    typed ``Any`` because this ground module imports no upper layer): used, left, max,
    window (s), on_exhausted, and restarts used out of ``max_restarts``."""
    used = len(in_window(error_times, now, policy.window))
    return {
        "used": used,
        "left": max(0, policy.max_errors - used),
        "max": policy.max_errors,
        "window": policy.window,
        "on_exhausted": policy.on_exhausted,
        "restarts": restarts,
        "max_restarts": policy.max_restarts,
    }


def enter_state(
    flow: Any,
    target: str,
    at: float,
    data: dict[str, Any] | None = None,
    event: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Instance column values for entering state ``target`` of ``flow`` (a
    ``runner.flowspec.compiled.CompiledFlow``) at ``at`` (epoch s), for an instance with
    ``data`` started by an event with fields ``event`` (``instances.route_event``).

    The status follows the state's kind (terminal → ``completed``; external → runnable but
    unscheduled, waiting for an event) and the state's counters start afresh. Its
    ``priority`` is the state's (its own, else the flow's; the write keeps one
    ``flowrun start --priority`` gave); ``runs_on`` the state's requirement resolved
    (``runner.labels.resolve``; ``None``: any worker).
    """
    st = flow.states[target]
    kind = st.kind
    routing = getattr(st, "routing", None)
    templates = routing.runs_on if routing is not None else None
    return {
        "runs_on": resolve(templates, data, event) if templates else None,
        "priority": getattr(st, "priority", 5),
        "state": target,
        "status": "completed" if kind == "terminal" else "runnable",
        "due_at": None if kind in ("terminal", "external") else at,
        "state_changed": at,
        "state_errors": [],
        "state_restarts": 0,
    }
