"""The database's clock as this process reads it: every lease, due time and heartbeat is
judged on it.

On PostgreSQL many hosts share the rows: one writes ``locked_until = now + lease``,
another takes the instance over once ``locked_until < now``. Each "now" must be the same
clock, or a host whose clock runs ahead takes over healthy attempts and one whose clock
lags has its own claims taken. flowrun therefore reads the server's clock
(``Dialect.server_clock``) and keeps the difference to this host's clock (the
*offset*): when a connection opens (``runner.store.pg_engine.pg_engine``) and in every worker
cycle, in the statement the cycle already sends first (``runner.store.leases.by_index``),
so no round trip is added. :func:`db_now` is then ``time.time() + offset``. A reading
is bracketed by this host's clock just before and after its statement; the server read
its clock in between, so the offset is off by at most half that round trip (the
reading's *error*). A host off by more than :data:`SKEW_WARN` seconds logs one WARNING.

SQLite is one host's file: its clock is the local one (offset 0).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine

log = logging.getLogger("flowrun.clock")

#: A host whose clock is off the database's by more than this (seconds) logs a WARNING.
SKEW_WARN = 1.0
#: How fast (seconds per second) an offset is assumed to grow stale: two clocks drift
#: apart by well under 1 ms/s, so a reading ``age`` seconds old is trusted as one with
#: ``age * DRIFT`` more error.
DRIFT = 0.001


class DbClock:
    """The database server's clock as read from this process (epoch seconds, UTC).

    ``offset`` is the server's clock minus this host's (seconds); ``error`` the most the
    offset may be off by (half the round trip of the reading it came from; ``inf`` before
    the first reading); ``label`` names the database in the WARNING.
    """

    __slots__ = ("offset", "error", "read_at", "label", "warned")

    def __init__(self, label: str = "the database server") -> None:
        self.offset = 0.0
        self.error = math.inf
        self.read_at = 0.0  # time.monotonic() of the reading in use
        self.label = label
        self.warned = False

    def now(self) -> float:
        """The database's time now, as far as this host can tell (epoch seconds)."""
        return time.time() + self.offset

    def observe(self, server: float, sent: float, received: float) -> None:
        """Take one reading: the server's clock said ``server`` (epoch seconds) for a
        statement sent at ``sent`` and answered at ``received`` (this host's
        ``time.time()``).

        The reading replaces the one in use when its error (half the round trip) is no
        larger than the error of the one in use grown by its age (:data:`DRIFT`): a
        reading delayed by a slow network does not replace a tight one, but any fresh
        reading replaces one that has grown stale. Logs one WARNING per clock the first
        time the offset exceeds :data:`SKEW_WARN`.
        """
        error = max(0.0, received - sent) / 2
        mono = time.monotonic()
        if error > self.error + (mono - self.read_at) * DRIFT:
            return
        self.offset = server - (sent + received) / 2
        self.error = error
        self.read_at = mono
        if abs(self.offset) > SKEW_WARN and not self.warned:
            self.warned = True
            log.warning(
                "this host's clock is %+.1f s off the clock of %s (more than %g s): "
                "flowrun judges leases and due times by the database's; fix the host's "
                "time sync",
                -self.offset,
                self.label,
                SKEW_WARN,
                extra={"offset": self.offset},
            )


#: The local clock (SQLite: one host): never corrected.
LOCAL = DbClock("this host")
LOCAL.error = 0.0

_clocks: weakref.WeakKeyDictionary[Engine, DbClock] = weakref.WeakKeyDictionary()


def track_server_clock(engine: Engine, label: str) -> DbClock:
    """Give ``engine`` (a SQLAlchemy ``Engine`` whose dialect has a ``server_clock``) a
    :class:`DbClock` of its own (``label`` names the database in its WARNING), which its
    owner feeds with readings (:meth:`DbClock.observe`); returns it."""
    clock = _clocks[engine] = DbClock(label)
    return clock


def clock_of(bind: Engine | Connection) -> DbClock:
    """The clock of ``bind`` (an ``Engine`` or ``Connection``): its database's, or
    :data:`LOCAL` where the engine reads none (SQLite). A dict lookup."""
    return _clocks.get(bind.engine, LOCAL)


def db_now(bind: Engine | Connection) -> float:
    """The time now on ``bind``'s database clock (epoch seconds, UTC; see
    :func:`clock_of`)."""
    return _clocks.get(bind.engine, LOCAL).now()
