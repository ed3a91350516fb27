"""Deadlines: when an instance's time in a state (or in its flow) runs out, and what then.

A state's ``deadline: {after, since, then}`` counts from when the instance entered the
state (``since: entered``, the default) or from when it was made (``since: created``);
the flow's top-level ``deadline`` counts from when the instance was made and covers every
state. Whatever the instance does meanwhile counts: waiting in an ``external`` state,
answering "not yet", sleeping, backing off, being paused. When a deadline passes, its
``then`` acts: a state of the flow (the instance moves there), ``failed``, ``paused``, or
``alert`` (nothing moves); each missed deadline is one ``deadline_missed`` lifecycle
event.

The instance row keeps one number, ``deadline_at`` (:func:`on_entry`, :func:`missed`):
the earliest deadline not acted on yet. A deadline whose time is before it was acted on
(or had passed before the instance entered the state it applies in), so "acted on" needs
no list: a deadline of time *t* is pending while ``t >= deadline_at``.

Pure (no I/O, no clock), like ``runner.flowspec.faults``: the daemon that acts on
deadlines (``runner.ops.deadlines``), the worker's commit of a move
(``runner.store.deadlines``), ``flowrun explain`` and the console all call these. Times
are float epoch seconds, UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: What a deadline's ``then`` may name besides a state.
THEN_OUTCOMES = ("failed", "paused", "alert")

#: The most deadlines :func:`missed` acts on in one go (moves into states whose own
#: ``since: created`` deadline has passed too could otherwise chain without end).
MAX_CHAIN = 16


@dataclass(frozen=True, slots=True)
class Deadline:
    """One compiled deadline.

    Attributes:
        after: seconds from ``since``.
        since: ``entered`` (the state) or ``created`` (the instance).
        then: a state of the flow, ``failed``, ``paused`` or ``alert``.
        scope: ``state`` or ``flow`` (the flow's top-level deadline).
    """

    after: float
    since: str
    then: str
    scope: str = "state"

    def at(self, entered: float, created: float) -> float:
        """The deadline's time for an instance made at ``created`` that entered its state
        at ``entered`` (epoch s)."""
        return (created if self.since == "created" else entered) + self.after


@dataclass(frozen=True, slots=True)
class Miss:
    """One missed deadline, as acted on.

    Attributes:
        deadline: the deadline.
        due: its time (epoch s).
        state: the instance's state when it was missed.
    """

    deadline: Deadline
    due: float
    state: str


@dataclass(slots=True)
class Firing:
    """What the deadlines due at a time do to an instance (:func:`missed`).

    Attributes:
        misses: the deadlines missed, in time order (empty: none due).
        state: the state after (the last ``then`` naming a state), or ``None``: unchanged.
        entered: when that state was entered (the time acted at), or ``None``.
        status: ``failed`` or ``paused`` when a ``then`` says so, else ``None``.
        next_at: the new ``deadline_at``: the earliest deadline still pending (``None``:
            none).
    """

    misses: list[Miss]
    state: str | None
    entered: float | None
    status: str | None
    next_at: float | None


def of_state(flow: Any, state: str) -> list[Deadline]:
    """The deadlines that apply while an instance of ``flow`` (a ``CompiledFlow``) is in
    ``state``: the state's own, then the flow's (none for a terminal or unknown state)."""
    st = flow.states.get(state)
    if st is None or st.kind == "terminal":
        return []
    return [d for d in (st.deadline, getattr(flow, "deadline", None)) if d is not None]


def on_entry(
    flow: Any, state: str, entered: float, created: float, stored: float | None = None
) -> float | None:
    """The ``deadline_at`` of an instance that enters ``state`` at ``entered``.

    The state's deadline counts whenever it falls (one ``since: created`` already past
    is due at once); the flow's only when still ahead (a flow deadline already past was
    acted on before). ``stored`` is the instance's ``deadline_at`` before the move: one
    already past was not acted on yet (the move came first) and is kept, so the flow's
    deadline it may stand for still acts. ``None``: no deadline."""
    if stored is not None and stored <= entered:
        return stored
    times = [
        t
        for d in of_state(flow, state)
        if (t := d.at(entered, created)) > entered or d.scope == "state"
    ]
    return min(times) if times else None


def missed(
    flow: Any, state: str, entered: float, created: float, stored: float, now: float
) -> Firing:
    """What the deadlines due at ``now`` do to an instance in ``state`` (entered at
    ``entered``, made at ``created``) whose ``deadline_at`` is ``stored``.

    The pending deadlines (time >= ``stored``) whose time has come act in time order (the
    state's first on a tie): ``alert`` only counts; a state moves the instance there, at
    ``now``, where that state's deadlines apply from then on (and the flow's still); a
    status ends the chain when ``failed``. Raises nothing."""
    misses: list[Miss] = []
    status: str | None = None
    moved: str | None = None
    done: set[Deadline] = set()
    # pending: time >= the threshold of its scope; a state entered here has fresh ones
    threshold = {"state": stored, "flow": stored}

    def pending() -> list[tuple[float, bool, Deadline]]:
        return sorted(
            (t, d.scope != "state", d)
            for d in of_state(flow, state)
            if d not in done and (t := d.at(entered, created)) >= threshold[d.scope]
        )

    for _ in range(MAX_CHAIN):
        due = [p for p in pending() if p[0] <= now]
        if not due:
            break
        t, _flow_scope, d = due[0]
        misses.append(Miss(d, t, state))
        done.add(d)
        if d.then == "alert":
            continue
        if d.then in ("failed", "paused"):
            status = d.then
            if status == "failed":
                return Firing(misses, moved, entered if moved else None, status, None)
            continue
        moved, state, entered = d.then, d.then, now
        threshold["state"] = float("-inf")
        done = {x for x in done if x.scope == "flow"}  # the new state's own are fresh
    left = pending()
    return Firing(misses, moved, entered if moved else None, status, left[0][0] if left else None)


def describe(flow: Any, state: str, entered: float, created: float, deadline_at: float | None):
    """``(time, Deadline)`` of the deadline ``deadline_at`` stands for (the pending one
    with that time), for ``flowrun explain`` and the console; ``None`` when none."""
    if deadline_at is None:
        return None
    for d in of_state(flow, state):
        t = d.at(entered, created)
        if abs(t - deadline_at) < 1e-6:
            return t, d
    return deadline_at, None


def from_spec(spec: Any, scope: str) -> Deadline | None:
    """The compiled deadline of a ``DeadlineSpec`` (``None`` stays ``None``)."""
    if spec is None:
        return None
    since = spec.since or ("created" if scope == "flow" else "entered")
    return Deadline(float(spec.after), since, spec.then, scope)
