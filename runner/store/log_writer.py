"""Attempt logs, written: what every attempt's :class:`~runner.log_buffer.AttemptLog`
holds, stored in batches by one thread per database, off the event loop.

Every :data:`EVERY` seconds :class:`LogWriter` takes what each log holds and inserts it
as ``attempt_logs`` rows (``runner.store.tables.LogChunk``) in ONE transaction, then
deletes the rows the cap dropped (past the head, before the kept last part). An attempt
that writes nothing costs no row and no write.

Switched off with ``FLOWRUN_LOG_CAPTURE=off`` in the daemon's environment (nothing is
captured: the ``bench/logs.py`` baseline).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any

from sqlalchemy import Engine, delete, insert

from runner.log_buffer import DEFAULT_MAX, END, ROW_MAX, AttemptLog
from runner.store.db import short_error
from runner.store.log_bell import notify_logs
from runner.store.tables import attempt_logs

log = logging.getLogger("flowrun.logs")

#: Seconds between the writer's batches (a follower sees output at most this late).
EVERY = 0.1
#: Bytes one batch stores at most (shared by the attempts that have rows): on SQLite a
#: batch holds the write lock the worker's claims and commits need, so a fleet of
#: handlers writing at full speed is stored at about 10 MB/s and the rest of their
#: middles dropped, rather than the loop's attempts waiting behind it.
BATCH_MAX = 1 << 20

CAPTURE = os.environ.get("FLOWRUN_LOG_CAPTURE", "on").lower() not in ("off", "0", "no")


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
        #: set by :meth:`give_up`: the exit does not wait for this database
        self.given_up = False

    def give_up(self) -> None:
        """The database does not answer and the worker stopped without it: the flush at
        exit (:func:`flush_all`) stores nothing more here, in one log line, instead of
        holding the stop past its grace waiting for it."""
        self.given_up = True

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
        wait = self.every
        while True:
            self._wake.wait(wait)
            self._wake.clear()
            t0 = time.monotonic()
            try:
                self.flush(BATCH_MAX)
            except Exception as exc:  # noqa: BLE001 - one line, then go on: logs are best effort
                log.warning("attempt logs not stored: %s", short_error(exc))
            wait = max(self.every, 2 * (time.monotonic() - t0))  # the lock free 2/3 of the time

    def flush(self, budget: int | None = None) -> int:
        """Store the queued logs' rows now (in the calling thread): all of them, or about
        ``budget`` bytes shared among the logs (the rest stays queued). Returns the rows
        inserted. Raises the database's errors (the rows taken are then lost)."""
        with self._flush_lock:
            with self._lock:
                items, self._queued = self._queued, []
            if not items:
                return 0
            share = None if budget is None else max(ROW_MAX, budget // len(items))
            inserts: list[dict[str, Any]] = []
            deletes: list[tuple[AttemptLog, int]] = []
            again: list[AttemptLog] = []
            for item in items:
                rows, keep_from, left = item.take(share)
                if left:
                    again.append(item)
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
            if again:
                with self._lock:
                    self._queued.extend(again)
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
                if inserts:
                    notify_logs(conn)
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


#: Seconds the process waits at exit for the last attempt logs to be stored: a database
#: that does not answer (a cut network) must not keep a stopped daemon alive.
FLUSH_AT_EXIT = 1.0


def _flush_each(writers: list[LogWriter]) -> None:
    for writer in writers:
        try:
            while writer.flush():
                pass
        except Exception as exc:  # noqa: BLE001
            log.warning("attempt logs not stored at exit: %s", short_error(exc))


@atexit.register
def flush_all(timeout: float = FLUSH_AT_EXIT) -> None:
    """Store what every writer still holds (at exit; after a worker stopped), waiting at
    most ``timeout`` seconds (on a thread of its own: a database that does not answer is
    given up, in one log line); a writer given up (:meth:`LogWriter.give_up`) is not
    waited for at all. Raises nothing: a failure is logged in one line."""
    writers = list(_writers.values())
    if any(w.given_up and w._queued for w in writers):
        log.warning("attempt logs not stored at exit: the database does not answer")
    writers = [w for w in writers if not w.given_up]
    if not writers:
        return
    flushing = threading.Thread(
        target=_flush_each, args=(writers,), name="flowrun-logs-exit", daemon=True
    )
    flushing.start()
    flushing.join(timeout)
    if flushing.is_alive():
        log.warning("attempt logs not stored at exit: no answer from the database in %gs", timeout)
