"""Attempt logs, written: each attempt's output buffered in memory, stored in batches.

A handler's output reaches an :class:`AttemptLog` as it is read (``write``: on the event
loop for an ``exec`` handler's pipes, on any thread for a ``call`` handler's prints and
log records): a list append under a lock, nothing else. One thread per database
(:class:`LogWriter`) takes what every log holds every :data:`EVERY` seconds and inserts
it as ``attempt_logs`` rows (``runner.store.tables.LogChunk``) in ONE transaction, off
the loop. An attempt that writes nothing costs no row and no write.

The cap (``log_max`` bytes an attempt, :data:`DEFAULT_MAX`): the first ``head`` bytes
(1 MiB, :data:`HEAD`) are always kept; after them only the last ``log_max - head``
bytes are: older rows past the head are deleted as newer ones come, so a reader sees a
gap, which it shows as a marker with the bytes dropped (``runner.store.log_reader``).
Memory stays bounded whatever a handler writes: an attempt holds at most
:data:`PENDING_MAX` bytes not yet stored; past that its oldest unstored bytes after the
head are dropped (they are part of the gap: the writer fell behind a handler writing
faster than the database takes it).

Switched off with ``FLOWRUN_LOG_CAPTURE=off`` in the daemon's environment (nothing is
captured; the ``bench/logs.py`` baseline).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque

from sqlalchemy import Engine, delete, insert

from runner.store.db import short_error
from runner.store.tables import attempt_logs

log = logging.getLogger("flowrun.logs")

#: Bytes an attempt keeps by default (``log_max``): 10 MiB.
DEFAULT_MAX = 10 << 20
#: Bytes of an attempt's output always kept from its start (less when ``log_max`` is
#: under twice this: half of it).
HEAD = 1 << 20
#: Seconds between the writer's batches (a follower sees output at most this late).
EVERY = 0.2
#: Bytes an attempt holds in memory that are not stored yet (past the head).
PENDING_MAX = 2 << 20
#: Bytes of one row at most (consecutive writes of one stream are joined up to it).
ROW_MAX = 64 << 10
#: Seconds within which consecutive writes of one stream are joined into one row.
JOIN_WITHIN = 0.05

STDOUT, STDERR, END = 1, 2, 0

CAPTURE = os.environ.get("FLOWRUN_LOG_CAPTURE", "on").lower() not in ("off", "0", "no")


class AttemptLog:
    """What one attempt wrote, until the writer stores it.

    Args:
        writer: the :class:`LogWriter` that stores it.
        instance_id, attempt: whose output it is.
        log_max: bytes kept at most (the head and the last part; see the module).
    """

    __slots__ = (
        "writer", "instance_id", "attempt", "head", "tail_max", "offset", "seq", "cut",
        "_head", "_tail", "_tail_bytes", "_lock", "_queued", "_ended", "deleted_to",
    )  # fmt: skip

    def __init__(self, writer: LogWriter, instance_id: int, attempt: int, log_max: int) -> None:
        self.writer = writer
        self.instance_id = instance_id
        self.attempt = attempt
        self.head = min(HEAD, log_max // 2)
        self.tail_max = max(0, log_max - self.head)
        self.offset = 0  # bytes written so far
        self.seq = 0
        self.cut = 0  # bytes before this offset past the head were dropped unstored
        self.deleted_to = 0  # the writer's: rows past the head before this are deleted
        self._head: list[list] = []  # [seq, stream, at, offset, bytearray] not stored yet
        self._tail: deque[list] = deque()
        self._tail_bytes = 0
        self._lock = threading.Lock()
        self._queued = False
        self._ended = False

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

    def end(self) -> None:
        """The attempt's output is complete: the writer stores what is left and a row
        saying so (only when something was written). Idempotent."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if self.offset:
                self.seq += 1
                self._tail.append([self.seq, END, time.time(), self.offset, bytearray()])
                self._queue()

    def take(self) -> tuple[list[list], int, bool]:
        """For the writer: ``(rows not stored yet, in order; the offset before which the
        bytes past the head go; ended)``, the rows handed over."""
        with self._lock:
            rows = self._head + list(self._tail)
            self._head = []
            self._tail.clear()
            self._tail_bytes = 0
            self._queued = False
            keep_from = max(self.cut, self.offset - self.tail_max, self.head)
            return rows, keep_from, self._ended


class LogWriter:
    """Stores the :class:`AttemptLog` s of one database from one thread, in batches.

    Args:
        engine: the database.
        every: seconds between batches.
    """

    def __init__(self, engine: Engine, every: float = EVERY) -> None:
        self.engine = engine
        self.every = every
        self._queued: list[AttemptLog] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()

    def open(self, instance_id: int, attempt: int, log_max: int = DEFAULT_MAX) -> AttemptLog:
        """A new :class:`AttemptLog` for ``instance_id``'s attempt ``attempt`` (1-based)."""
        return AttemptLog(self, instance_id, attempt, log_max)

    def queue(self, item: AttemptLog) -> None:
        """``item`` has rows to store (called by :class:`AttemptLog`)."""
        with self._lock:
            self._queued.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flowrun-logs", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.every)
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - one line, then go on: logs are best effort
                log.warning("attempt logs not stored: %s", short_error(exc))

    def flush(self) -> int:
        """Store every queued log's rows now (in the calling thread); returns the rows
        inserted. Raises the database's errors (the rows taken are then lost)."""
        with self._flush_lock:
            with self._lock:
                items, self._queued = self._queued, []
            if not items:
                return 0
            inserts: list[dict] = []
            deletes: list[tuple[AttemptLog, int]] = []
            for item in items:
                rows, keep_from, _ended = item.take()
                for seq, stream, at, offset, data in rows:
                    if item.head <= offset < keep_from and stream != END:
                        continue  # dropped by the cap before it was ever stored
                    inserts.append(
                        {
                            "instance_id": item.instance_id,
                            "attempt": item.attempt,
                            "seq": seq,
                            "stream": stream,
                            "at": at,
                            "offset": offset,
                            "data": bytes(data),
                        }
                    )
                if keep_from > max(item.deleted_to, item.head):
                    deletes.append((item, keep_from))
            with self.engine.begin() as conn:
                if inserts:
                    conn.execute(insert(attempt_logs), inserts)
                for item, keep_from in deletes:
                    c = attempt_logs.c
                    conn.execute(
                        delete(attempt_logs).where(
                            c.instance_id == item.instance_id,
                            c.attempt == item.attempt,
                            c.offset >= item.head,
                            c.offset < keep_from,
                            c.stream != END,
                        )
                    )
                    item.deleted_to = keep_from
            return len(inserts)


_writers: dict[int, LogWriter] = {}
_writers_lock = threading.Lock()


def writer_for(engine: Engine) -> LogWriter | None:
    """The :class:`LogWriter` of ``engine`` (made on first use); ``None`` when capture is
    off (``FLOWRUN_LOG_CAPTURE=off``)."""
    if not CAPTURE:
        return None
    found = _writers.get(id(engine))
    if found is None or found.engine is not engine:
        with _writers_lock:
            found = _writers.get(id(engine))
            if found is None or found.engine is not engine:
                found = _writers[id(engine)] = LogWriter(engine)
    return found


@atexit.register
def flush_all() -> None:
    """Store what every writer still holds (at exit; after a worker stopped). Raises
    nothing: a failure is logged in one line."""
    for writer in list(_writers.values()):
        try:
            writer.flush()
        except Exception as exc:  # noqa: BLE001
            log.warning("attempt logs not stored at exit: %s", short_error(exc))
