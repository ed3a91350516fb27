"""One attempt's output, held in memory until it is stored: :class:`AttemptLog`.

A handler's output reaches its attempt's :class:`AttemptLog` as it is read (``write``: on
the event loop for an ``exec`` handler's pipes, on any thread for a ``call`` handler's
prints and log records): an append under a lock, no I/O. A writer
(``runner.store.log_writer``) takes the rows every few tenths of a second and stores
them.

The cap (``log_max`` bytes an attempt, :data:`DEFAULT_MAX`): the first ``head`` bytes
(1 MiB, :data:`HEAD`) are always kept; after them only the last ``log_max - head``
bytes are (the writer deletes older stored rows past the head as newer ones come).
Memory stays bounded whatever a handler writes: an attempt holds at most
:data:`PENDING_MAX` bytes not yet stored; past that its oldest unstored bytes after the
head are dropped (they belong to the dropped middle: the writer fell behind a handler
writing faster than the database takes it). Ground level: pure, no database.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Protocol

#: Bytes an attempt keeps by default (``log_max``): 10 MiB.
DEFAULT_MAX = 10 << 20
#: Bytes of an attempt's output always kept from its start (less when ``log_max`` is
#: under twice this: half of it).
HEAD = 1 << 20
#: Bytes an attempt holds in memory that are not stored yet (past the head).
PENDING_MAX = 2 << 20
#: Bytes of one row at most (consecutive writes of one stream are joined up to it).
ROW_MAX = 64 << 10
#: Seconds within which consecutive writes of one stream are joined into one row.
JOIN_WITHIN = 0.05

STDOUT, STDERR, END = 1, 2, 0
#: Seconds a follower (``flowrun logs -f``, the console's log screen) still waits for an
#: ended attempt's last output when no end row says it is all there (a lost attempt).
END_GRACE = 1.5


class Queue(Protocol):
    """Who stores an :class:`AttemptLog`: told once each time it has rows to store."""

    def queue(self, item: AttemptLog) -> None: ...


class AttemptLog:
    """What one attempt wrote, until the writer stores it.

    Args:
        writer: who stores it (``runner.store.log_writer.LogWriter``).
        instance_id, attempt: whose output it is.
        log_max: bytes kept at most (the head and the last part; see the module).
    """

    __slots__ = (
        "writer", "instance_id", "attempt", "head", "tail_max", "offset", "seq", "cut",
        "_head", "_tail", "_tail_bytes", "_lock", "_queued", "_ended", "deleted_to", "secrets",
    )  # fmt: skip

    def __init__(self, writer: Queue, instance_id: int, attempt: int, log_max: int) -> None:
        self.writer = writer
        self.instance_id = instance_id
        self.attempt = attempt
        self.head = min(HEAD, log_max // 2)
        self.tail_max = max(0, log_max - self.head)
        self.offset = 0  # bytes written so far
        self.seq = 0
        self.cut = 0  # bytes before this offset past the head were dropped unstored
        self.deleted_to = 0  # the writer's: rows past the head before this are deleted
        self._head: list[list[Any]] = []  # [seq, stream, at, offset, bytearray] not stored yet
        self._tail: deque[list[Any]] = deque()
        self._tail_bytes = 0
        self._lock = threading.Lock()
        self._queued = False
        self._ended = False
        #: secret values a ``call`` handler's text is redacted of before it is written
        #: (``runner.handlers.capture``; an ``exec`` handler's pipes are redacted as read)
        self.secrets: tuple[str, ...] = ()

    def write(self, stream: int, data: bytes) -> None:
        """Add ``data`` written on ``stream`` (:data:`STDOUT` or :data:`STDERR`) now.
        Cheap (no I/O); safe from any thread. Raises nothing."""
        if not data:
            return
        now = time.time()
        with self._lock:
            if self._ended:  # a sync handler's thread still printing after its attempt
                return
            start = self.offset
            if start < self.head:
                room = self.head - start
                self._add(self._head, stream, now, data[:room])
                data = data[room:]
                if not data:
                    self._queue()
                    return
            self._add(self._tail, stream, now, data)
            self._tail_bytes += len(data)
            while self._tail_bytes > PENDING_MAX and len(self._tail) > 1:
                old = self._tail.popleft()
                self._tail_bytes -= len(old[4])
                self.cut = old[3] + len(old[4])
            self._queue()

    def _add(self, into, stream: int, now: float, data: bytes) -> None:
        last = into[-1] if into else None
        if (
            last is not None
            and last[1] == stream
            and len(last[4]) + len(data) <= ROW_MAX
            and now - last[2] < JOIN_WITHIN
        ):
            last[4] += data
        else:
            self.seq += 1
            into.append([self.seq, stream, now, self.offset, bytearray(data)])
        self.offset += len(data)

    def _queue(self) -> None:
        if not self._queued:
            self._queued = True
            self.writer.queue(self)

    def end(self) -> int:
        """The attempt's output is complete: the writer stores what is left and a row
        saying so; an attempt that wrote nothing costs no row and no work of the writer
        (its attempt row's ``log_bytes``, 0, tells a follower it ended). Returns the bytes
        written (both streams, before the cap). Idempotent."""
        with self._lock:
            if not self._ended:
                self._ended = True
                if self.offset:
                    self.seq += 1
                    self._tail.append([self.seq, END, time.time(), self.offset, bytearray()])
                    self._queue()
            return self.offset

    def take(self, budget: int | None = None) -> tuple[list[list[Any]], int, bool]:
        """For the writer: ``(rows handed over, in order; the offset before which the
        bytes past the head go; whether rows are left)``. With a ``budget``, rows up to
        about that many bytes (at least one); the rest stays for the next batch (and
        may still be dropped by the cap)."""
        with self._lock:
            if budget is None:
                rows = self._head + list(self._tail)
                self._head = []
                self._tail.clear()
                self._tail_bytes = 0
            else:
                rows, used, n = [], 0, 0
                for row in self._head:
                    if used >= budget and rows:
                        break
                    rows.append(row)
                    used += len(row[4])
                    n += 1
                del self._head[:n]
                while not self._head and self._tail and (used < budget or not rows):
                    row = self._tail.popleft()
                    rows.append(row)
                    used += len(row[4])
                    self._tail_bytes -= len(row[4])
            left = bool(self._head or self._tail)
            self._queued = left
            keep_from = max(self.cut, self.offset - self.tail_max, self.head)
            return rows, keep_from, left
