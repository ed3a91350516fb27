"""How much of an event loop's time reading handlers' output may take.

A daemon's loop reads every ``exec`` handler's stdout and stderr as data comes
(``runner.handlers.exec_handler``). Twenty handlers writing at full speed kept a pipe
readable at every turn: the loop spent three quarters of its time reading them, each of
its turns read twenty 64 KiB chunks, and a new instance's start waited behind them (start
latency p99 44 ms against 7 ms idle on SQLite, ``bench/logs.py --parts latency``).

The reads of one loop share a budget: at most :data:`SHARE` of each :data:`WINDOW`. A pipe
found readable once the window's share is spent is not read: its handler's output pipes
stop being watched until the next window begins (the kernel's pipe buffer holds what comes
meanwhile; a handler that fills it waits in ``write``, as it would behind any slow
reader). Output that comes slower than the budget is never held back, and no output is
lost or reordered within a stream: the pipes are read again, in full, from where they
stopped. The same back-pressure is what log shippers apply to a producer faster than
them (Fluent Bit's ``Mem_Buf_Limit`` pauses an input until its buffer drains).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

#: Seconds in one budget window.
WINDOW = 0.01
#: The part of each window the loop may spend reading handlers' output.
SHARE = 0.25


class ReadPace:
    """The output-reading budget of one event loop (``loop``): :meth:`spent` after each
    read (seconds it took), :meth:`over` before one, :meth:`later` to be called back when
    the next window begins. Loop time (``loop.time()``, monotonic seconds) throughout;
    not thread-safe (the loop's thread only)."""

    __slots__ = ("loop", "_began", "_used", "_paused", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._began = -WINDOW  # when the current window began
        self._used = 0.0  # seconds of reading in it
        self._paused: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None

    def over(self) -> bool:
        """True when this window's share is spent (a new window starts with none)."""
        now = self.loop.time()
        if now - self._began >= WINDOW:
            self._began, self._used = now, 0.0
            return False
        return self._used >= SHARE * WINDOW

    def spent(self, seconds: float) -> None:
        """Count ``seconds`` of reading in the current window."""
        self._used += seconds

    def later(self, resume: Callable[[], None]) -> None:
        """Call ``resume()`` once, when the next window begins."""
        self._paused.append(resume)
        if self._timer is None:
            self._timer = self.loop.call_at(self._began + WINDOW, self._resume)

    def _resume(self) -> None:
        self._timer = None
        paused, self._paused = self._paused, []
        for resume in paused:
            resume()


_paces: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadPace] = weakref.WeakKeyDictionary()


def pace_of(loop: asyncio.AbstractEventLoop) -> ReadPace:
    """The :class:`ReadPace` of ``loop`` (made at the first use)."""
    pace = _paces.get(loop)
    if pace is None:
        pace = _paces[loop] = ReadPace(loop)
    return pace
