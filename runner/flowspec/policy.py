"""A state's effective run policy: try interval, time limits, error budget, backoff.

``state_policy`` merges a flow's ``defaults:`` with one state's own keys (a key the state
gives wins; ``error_budget`` and ``backoff`` merge key by key). The result is frozen and
holds plain numbers: every duration in float seconds. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the read side (show, explain) needs Policy without pydantic
    from runner.flowspec.spec import BackoffSpec, Defaults, ErrorBudgetSpec, StateSpec

STATUS_OUTCOMES = ("failed", "paused")
"""``on_exhausted`` values that name a status rather than a state."""


@dataclass(frozen=True)
class Backoff:
    """Delay after consecutive errors: ``initial * factor**(n-1)`` capped at ``max``.

    Attributes:
        initial: seconds after the first error.
        factor: growth per further consecutive error (``>= 1``).
        max: the cap, in seconds.
        jitter: ``"full"`` (uniform in ``[0, base]``), ``"equal"`` (uniform in
            ``[base/2, base]``) or ``"none"``.
    """

    initial: float
    factor: float
    max: float
    jitter: str  # full | equal | none

    def delay(self, errors: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``errors``-th consecutive error.

        Args:
            errors: consecutive errors so far (``>= 1``; smaller counts as 1).
            rand: a source of floats in ``[0, 1)`` for the jitter (tests inject one).

        Returns the delay in seconds (``>= 0``), drawn from :meth:`bounds`; raises nothing.
        """
        base, low, high = self.bounds(errors)
        return low + (high - low) * rand() if high > low else base

    def bounds(self, errors: int) -> tuple[float, float, float]:
        """``(base, low, high)`` in seconds: the base delay after the ``errors``-th
        consecutive error and the range its jittered delay is drawn from. Raises nothing."""
        base = min(self.max, self.initial * self.factor ** max(0, errors - 1))
        if self.jitter == "full":
            return base, 0.0, base
        if self.jitter == "equal":
            return base, base / 2, base
        return base, base, base


@dataclass(frozen=True)
class Policy:
    """Effective per-state policy (defaults overridden by the state). Durations in seconds.

    Attributes:
        try_interval: seconds before trying again after a handler's "not yet".
        timeout: hard limit of one attempt in seconds, or ``None`` for none.
        keepalive: seconds within which a handler must signal, or ``None``.
        max_errors: errors allowed within ``window`` before the budget is exhausted.
        window: the error budget's sliding window, in seconds.
        on_exhausted: ``"failed"``, ``"paused"`` (a status) or a state name.
        backoff: the delay after consecutive errors.
        max_restarts: lost attempts (a dead worker's) allowed in one state.
        log_max: bytes of output kept per attempt (``runner.store.log_writer``).
    """

    try_interval: float
    timeout: float | None
    keepalive: float | None
    max_errors: int
    window: float
    on_exhausted: str  # "failed" | "paused" | a state name
    backoff: Backoff
    max_restarts: int
    log_max: int = 10 << 20


def state_policy(defaults: Defaults, st: StateSpec) -> Policy:
    """The effective ``Policy`` of state ``st`` under the flow's ``defaults``.

    A policy key the state sets explicitly wins (``timeout``/``keepalive`` even when set
    to ``None``, which disables the limit); ``error_budget`` and ``backoff`` are merged
    key by key over the defaults'. Both arguments are validated spec models, so this
    raises nothing.
    """
    given = st.model_fields_set

    def pick(key: str) -> Any:
        value = getattr(st, key)
        if key in given and (value is not None or key in ("timeout", "keepalive")):
            return value
        return getattr(defaults, key)

    def merge(base: Any, over: Any) -> Any:
        if over is None:
            return base
        return base.model_copy(update={k: getattr(over, k) for k in over.model_fields_set})

    budget: ErrorBudgetSpec = merge(defaults.error_budget, st.error_budget)
    backoff: BackoffSpec = merge(defaults.backoff, st.backoff)
    return Policy(
        try_interval=pick("try_interval"),
        timeout=pick("timeout"),
        keepalive=pick("keepalive"),
        max_errors=budget.max_errors,
        window=budget.window,
        on_exhausted=budget.on_exhausted,
        backoff=Backoff(backoff.initial, backoff.factor, backoff.max, backoff.jitter),
        max_restarts=pick("max_restarts"),
        log_max=pick("log_max"),
    )
