"""The worker loop's small clocks: periodic chores and the database outage backoff.

:class:`LoopingTimer` is Takahē's ``stator.runner.LoopingTimer`` (a chore due once every
``interval``) with the loop's own clock passed in, so one turn of the loop reads
``time.monotonic()`` once and every timer agrees on "now". :class:`OutageBackoff` spaces
the retries of a database that went away.
"""

from __future__ import annotations

import logging
import time

from runner.store.db_errors import short_error

log = logging.getLogger("flowrun.worker")  # the worker's own log: these are its messages


class LoopingTimer:
    """A chore due once every ``interval`` seconds (``time.monotonic`` clock).

    Due at once when created (Takahē's ``trigger_at_start``). :meth:`check` answers
    "due?" and, if so, schedules the next time; :meth:`due` only answers, and
    :meth:`restart` schedules, for a chore that may decide not to run after all.
    ``next_at`` (monotonic seconds) is when it is next due: the loop sleeps until the
    earliest of them.
    """

    __slots__ = ("interval", "next_at")

    def __init__(self, interval: float, now: float | None = None) -> None:
        self.interval = interval
        self.next_at = time.monotonic() if now is None else now

    def due(self, now: float) -> bool:
        """Whether the chore is due at ``now`` (monotonic seconds); changes nothing."""
        return now >= self.next_at

    def restart(self, now: float) -> None:
        """Next due one ``interval`` after ``now`` (the chore just ran)."""
        self.next_at = now + self.interval

    def check(self, now: float) -> bool:
        """Whether the chore is due at ``now``; if so it is next due ``interval`` later."""
        if now >= self.next_at:
            self.next_at = now + self.interval
            return True
        return False


class OutageLog:
    """The log lines of one database outage, however many parts of a worker see it: the
    first failure, then at most one line every :data:`QUIET` seconds (saying how many
    failures it folded), and "database reachable again" once it answers.

    A worker's loop, its database thread's guarded calls and its stop all report here, so
    a stopping worker whose heartbeat, lease renewals and fence checks all fail says so
    once, not several times a second.
    """

    QUIET = 30.0

    def __init__(self) -> None:
        self.failures = 0  # since the database last answered
        self._logged = 0.0  # time.monotonic() of the last line
        self._folded = 0  # failures not logged since that line

    def failed(self, exc: BaseException, then: str = "") -> None:
        """Count a failure (``exc``: the database error); ``then`` is appended to a line
        logged now (what happens next, e.g. "; retrying every 2.0s")."""
        self.failures += 1
        now = time.monotonic()
        if self.failures > 1 and now - self._logged < self.QUIET:
            self._folded += 1
            return
        folded = f" ({self._folded} more failures since the last line)" if self._folded else ""
        self._logged, self._folded = now, 0
        log.warning("database unavailable (%s)%s%s", short_error(exc), then, folded)

    def back(self) -> None:
        """The database answered: say so once if it had failed."""
        if self.failures:
            log.warning("database reachable again")
        self.failures = self._folded = 0


class OutageBackoff:
    """Exponential backoff for database outages: 0.5 s doubling to 2 s (a retry every
    2 s costs the database nothing, and work resumes within 2 s of its return).

    ``fail(exc)`` counts one more failure, reports it to the :class:`OutageLog` ``said``
    (the worker's one; a new one when not given: the first failure is logged, then at most
    every ``OutageLog.QUIET`` seconds) and returns the delay in seconds before the next
    try; ``ok()`` resets the count, logging that the database is back if it had failed;
    ``failures`` is the count since the last success."""

    CAP = 2.0

    def __init__(self, said: OutageLog | None = None) -> None:
        self.failures = 0
        self.said = said if said is not None else OutageLog()

    def fail(self, exc: BaseException) -> float:
        """Count a failure (``exc``: the database error); returns the delay in seconds."""
        self.failures += 1
        delay = min(self.CAP, 0.5 * 2 ** (self.failures - 1))
        self.said.failed(exc, f"; retrying every {delay:.1f}s ({self.failures} failures)")
        return delay

    def ok(self) -> None:
        """The database answered: reset the count (and say it is back, if it was away)."""
        if self.failures:
            self.said.back()
        self.failures = 0
