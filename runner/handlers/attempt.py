"""What every attempt shares, whatever its handler: result, context, limits, cancel.

``runner.handlers.exec_handler`` and ``runner.handlers.call_handler`` run the two kinds
of handler on top of these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TAIL = 4000


#: ``(new_data, checkpoint) -> bool``: durably store a checkpoint; False when the lease is lost.
CheckpointFn = Callable[[dict[str, Any], dict[str, Any]], bool]


class LeaseLost(Exception):
    """Raised inside a ``call`` handler's ``ctx.checkpoint`` when the instance was taken away."""


@dataclass
class AttemptResult:
    """What one attempt produced.

    ``outcome`` is moved, not_yet, sleep, error, timeout or cancelled (or, set by the
    worker for an attempt its self-fence ended, lost); ``to_state`` the
    requested target (``moved`` only; not yet checked against the graph); ``data`` the
    instance data as the handler left it; ``checkpoint`` the last checkpoint written, if
    any; ``sleep_until`` (``sleep`` only) when the instance wakes, epoch seconds UTC;
    ``log_bytes`` the bytes its handler wrote to its attempt log (``None``: not captured).
    """

    outcome: str
    data: dict[str, Any]
    to_state: str | None = None
    error: str | None = None
    checkpoint: dict[str, Any] | None = None
    sleep_until: float | None = None
    log_bytes: int | None = None


@dataclass(frozen=True)
class Sleep:
    """A handler's request to put its instance to sleep until ``until`` (epoch seconds,
    UTC), in the same state, spending nothing (Metafora's ``Sleep`` transition).

    A ``call`` handler returns one (``return ctx.sleep_until(when)`` or
    ``return Sleep.at(when)``); an ``exec`` handler writes ``sleep <time>`` on its control
    channel (``runner.control.sleep``).
    """

    until: float

    @staticmethod
    def at(when: datetime | float | int) -> Sleep:
        """A ``Sleep`` until ``when``: an aware ``datetime`` (a naive one is taken as UTC)
        or epoch seconds. Raises ``TypeError`` for anything else."""
        return Sleep(epoch(when))


def epoch(when: datetime | float | int) -> float:
    """``when`` as epoch seconds: an aware ``datetime`` (naive means UTC) or a number.

    Raises ``TypeError`` for anything else.
    """
    if isinstance(when, datetime):
        if when.tzinfo is None:
            from datetime import UTC

            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    if isinstance(when, int | float) and not isinstance(when, bool):
        return float(when)
    raise TypeError(f"sleep until needs a datetime or epoch seconds, not {type(when).__name__}")


def slept(sleep: Sleep, data: dict[str, Any], checkpoint: dict[str, Any] | None) -> AttemptResult:
    """The ``sleep`` result of an attempt that asked to sleep until ``sleep.until``; its
    ``error`` column says until when (ISO 8601 UTC), for ``show`` and ``explain``."""
    from datetime import UTC

    iso = datetime.fromtimestamp(sleep.until, UTC).isoformat(timespec="seconds")
    return AttemptResult(
        "sleep",
        data,
        error=f"sleep until {iso.replace('+00:00', 'Z')}",
        checkpoint=checkpoint,
        sleep_until=sleep.until,
    )


@dataclass
class Context:
    """What a ``call`` handler receives.

    Attributes: ``data`` (the instance data, a dict the handler may change; it is committed
    with the outcome), ``instance_id``, ``flow``, ``state``, ``attempt`` (1-based),
    ``env`` (the state's ``env`` variables, rendered: name -> value) and ``secrets`` (the
    state's secrets, read when the attempt started: name -> value; never stored), ``log``
    (a ``logging.Logger`` whose records go to this attempt's log, as what the handler
    ``print``s and logs with any logger from its own task or thread:
    ``runner.handlers.capture``).
    """

    data: dict[str, Any]
    instance_id: int
    flow: str
    state: str
    attempt: int
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("flowrun.handler"))
    _attempt_log: object = field(default=None, repr=False)  # runner.log_buffer.AttemptLog
    _checkpoint: CheckpointFn | None = field(default=None, repr=False)
    _signal: Callable[[], None] = field(default=lambda: None, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    _last_checkpoint: dict[str, Any] | None = field(default=None, repr=False)
    _sleep: Sleep | None = field(default=None, repr=False)

    def sleep_until(self, when: datetime | float) -> Sleep:
        """Put the instance to sleep until ``when`` (an aware ``datetime``, naive means
        UTC, or epoch seconds) once the handler returns, in the same state; no error
        budget or restart is spent. Returns the :class:`Sleep` the handler may return too
        (``return ctx.sleep_until(when)``); a later call replaces an earlier one.

        Raises ``TypeError`` for a ``when`` of another type.
        """
        self._sleep = Sleep.at(when)
        return self._sleep

    @property
    def cancelled(self) -> bool:
        """True once the attempt was cancelled or timed out: a sync handler should return."""
        return self._cancelled

    def keepalive(self) -> None:
        """Reset the state's keepalive deadline."""
        self._signal()

    def checkpoint(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into ``data`` and store it durably before returning.

        Raises ``LeaseLost`` when the instance was taken away (paused, killed, lease lost).
        """
        self.data.update(values)
        self._last_checkpoint = dict(values)
        self._signal()
        if self._checkpoint is not None and not self._checkpoint(dict(self.data), dict(values)):
            self._cancelled = True
            raise LeaseLost(f"instance {self.instance_id} was taken away")


@dataclass
class Limits:
    """Time limits of one attempt, in seconds (``None``: no limit)."""

    timeout: float | None
    keepalive: float | None
    kill_grace: float = 5.0


class Watch:
    """Deadline bookkeeping shared by both handler kinds."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.started = time.monotonic()
        self.last_signal = self.started

    def signal(self) -> None:
        self.last_signal = time.monotonic()

    def remaining(self) -> tuple[float | None, str]:
        """Seconds until the nearest deadline and what it is."""
        now = time.monotonic()
        best: tuple[float | None, str] = (None, "")
        if self.limits.timeout is not None:
            best = (self.started + self.limits.timeout - now, f"timeout ({self.limits.timeout:g}s)")
        if self.limits.keepalive is not None:
            left = self.last_signal + self.limits.keepalive - now
            if best[0] is None or left < best[0]:
                best = (left, f"missed keepalive ({self.limits.keepalive:g}s)")
        return best


class Cancel:
    """A one-shot cancel signal for one attempt, carrying the reason (cheap: no task)."""

    __slots__ = ("reason", "grace", "_callbacks")

    def __init__(self) -> None:
        self.reason: str | None = None
        #: seconds an ``exec`` handler gets between SIGTERM and SIGKILL for this cancel
        #: (``None``: the attempt's ``Limits.kill_grace``)
        self.grace: float | None = None
        self._callbacks: list[Callable[[str], None]] = []

    def is_set(self) -> bool:
        """True once :meth:`set` was called."""
        return self.reason is not None

    def set(self, reason: str = "cancelled", *, grace: float | None = None) -> None:
        """Cancel the attempt (idempotent; the first reason wins). ``grace`` (seconds)
        shortens an ``exec`` handler's time between SIGTERM and SIGKILL (a worker whose
        lease runs out must be rid of its handlers in time)."""
        if self.reason is None:
            self.reason = reason
            self.grace = grace
            for cb in self._callbacks:
                cb(reason)

    def on_set(self, cb: Callable[[str], None]) -> None:
        """Call ``cb(reason)`` when cancelled (at once if already)."""
        if self.reason is not None:
            cb(self.reason)
        else:
            self._callbacks.append(cb)


async def supervise(
    done: asyncio.Future[Any], watch: Watch, cancel: Cancel
) -> tuple[str, str | None]:
    """Wait for ``done``, a cancel, or a deadline: ("done"|"cancelled"|"timeout", why).

    Built from callbacks and one future per attempt (no extra tasks), since it runs for
    every attempt of every instance.
    """
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    timer: list[asyncio.TimerHandle] = []

    def stop(how: str, why: str | None) -> None:
        if not waiter.done():
            waiter.set_result((how, why))

    def arm() -> None:
        left, why = watch.remaining()
        if left is None:
            return
        if left <= 0:
            stop("timeout", why)
        else:
            timer[:] = [loop.call_later(left, arm)]

    if done.done():
        return "done", None
    done.add_done_callback(lambda _: stop("done", None))
    cancel.on_set(lambda reason: stop("cancelled", reason))
    arm()
    try:
        return await waiter
    finally:
        for t in timer:
            t.cancel()
