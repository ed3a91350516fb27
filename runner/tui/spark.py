"""The console's throughput sparkline: attempts finished per whole second over the last
minute, read a little at a time.

``attempts.finished_at`` has no index (it would cost every attempt's insert), so a look
cannot ask for "the last minute" directly. An attempt's row is inserted when the attempt
ends (its ``finished_at`` is at most its insert time) and ids only grow, so
:class:`Sparkline` keeps the counts between looks and reads only rows written since:

- SQLite has one writer at a time, so ids are in commit order: a look reads the rows
  above the highest id the last look saw and adds them in;
- on PostgreSQL, transactions commit out of id order, so a look recounts the seconds
  not yet over (:data:`MARGIN`) from the rows above the highest id a look saw before
  them (less :data:`SLACK` for clocks).

The database counts the rows per second (``GROUP BY``): a few dozen rows come back, and
the driver gives up the GIL while it works, so the console's UI loop is not held by a
Python loop over the rows. A first look, a long pause or a clock set back reads at most
the :data:`LOOKBACK` newest rows. An attempt whose row a checkpoint wrote while it ran is
counted only by such a look (its row is older than the ones read).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sqlalchemy import Connection, Integer, cast, func, select

from runner.store.dialect import dialect_of
from runner.store.tables import attempts

#: The newest attempt rows a first look reads (a rowid range, not a scan).
LOOKBACK = 50_000

#: Seconds a second stays open after it ends, for rows committed a little late.
MARGIN = 1

#: Seconds allowed between the clocks of the hosts that wrote ``finished_at`` and the
#: console's.
SLACK = 1.0


@dataclass
class Sparkline:
    """Per-second counts of finished attempts, kept between looks (one per console).

    ``done`` maps a whole second (epoch, UTC) to its count, for the seconds before
    ``done_before`` that no later commit can change; ``marks`` holds ``(when, max id)``
    of recent looks (``when`` in the console's clock, epoch seconds); until
    ``suspect_until`` (after the clock went back) every look recounts the window."""

    done: dict[int, int] = field(default_factory=dict)
    done_before: int | None = None
    marks: deque[tuple[float, int]] = field(default_factory=deque)
    suspect_until: float = 0.0
    floor: int = 0  #: the last look read the rows above this id

    def look(self, conn: Connection, now: float, seconds: int = 60) -> list[int]:
        """Attempts finished in each of the ``seconds`` whole seconds before ``now``
        (epoch seconds), oldest first. Reads through ``conn``; raises what its
        ``execute`` raises."""
        end = int(now)
        first = end - seconds
        a = attempts.c
        top = conn.execute(select(func.max(a.id))).scalar() or 0
        if dialect_of(conn).serial_writes:  # SQLite: one writer at a time
            return self._added(conn, first, end, top)
        start, floor = self._plan(now, first, top)
        self.floor = floor
        sec = cast(func.floor(a.finished_at), Integer).label("sec")
        stmt = (
            select(sec, func.count())
            .where(a.id > floor, a.id <= top, a.finished_at >= start, a.finished_at < end)
            .group_by(sec)
        )
        fresh = {int(s): n for s, n in conn.execute(stmt)}
        closed = end - MARGIN
        for s in range(start, closed):
            self.done[s] = fresh.get(s, 0)
        self._forget_before(first)
        self.done_before = max(closed, start)
        self.marks.append((now, top))
        while self.marks and self.marks[0][0] < now - seconds - 10:
            self.marks.popleft()
        return [self.done.get(s, fresh.get(s, 0)) for s in range(first, end)]

    def _added(self, conn: Connection, first: int, end: int, top: int) -> list[int]:
        """SQLite: one writer at a time gives ids in commit order, so the rows above the
        last look's highest id are exactly the ones no look has counted yet: each look
        adds them to ``done`` (here every second's count so far, the current one too)."""
        last = self.marks[-1] if self.marks else None
        if last is None or first < (self.done_before or 0) or top - last[1] > LOOKBACK:
            self.done.clear()  # a first look, a clock gone back or a long pause
            floor = top - LOOKBACK
        else:
            floor = last[1]
        self.floor = floor
        a = attempts.c
        sec = cast(a.finished_at, Integer).label("sec")  # truncates: the values are > 0
        stmt = (
            select(sec, func.count())
            .where(a.id > floor, a.id <= top, a.finished_at >= first)
            .group_by(sec)
        )
        for s, n in conn.execute(stmt):
            self.done[int(s)] = self.done.get(int(s), 0) + n
        self._forget_before(first)
        self.done_before = first
        self.marks.clear()
        self.marks.append((float(end), top))
        return [self.done.get(s, 0) for s in range(first, end)]

    def _forget_before(self, first: int) -> None:
        """Drop the counts of the seconds before ``first`` (out of the window)."""
        for s in [s for s in self.done if s < first]:
            del self.done[s]

    def _plan(self, now: float, first: int, top: int) -> tuple[int, int]:
        """``(start, floor)``: recount the seconds from ``start`` on, reading the rows
        whose id is above ``floor``. A first look, a clock gone back or a gap longer
        than the window recounts the whole window from the newest :data:`LOOKBACK` rows, as
        does a look with no earlier look old enough to bound the new rows' ids."""
        if self.marks and now < self.marks[-1][0]:
            # the clock went back: rows ended "later" than now exist until it is past
            # where it was again, and ids no longer follow the clock until then
            self.suspect_until = self.marks[-1][0] + MARGIN + 2 * SLACK
            self.marks.clear()
        start = self.done_before if now >= self.suspect_until else None
        seen = [i for t, i in self.marks if start is not None and t <= start - SLACK]
        if start is None or start < first or not seen:
            self.done.clear()
            return first, top - LOOKBACK
        return start, max(seen)
