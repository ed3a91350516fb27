"""Attempt logs, written: what every attempt's :class:`~runner.log_buffer.AttemptLog`
holds, stored in batches by one thread per database, off the event loop.

Every :data:`EVERY` seconds :class:`LogWriter` takes what each log holds and inserts it
as ``attempt_logs`` rows (``runner.store.tables.LogChunk``) in ONE transaction, then
deletes the rows the cap dropped (past the head, before the kept last part): one
multi-row statement each, their SQL text made once per row count (:class:`_Statements`),
so the transaction holds SQLite's write lock for few GIL hand-overs. An attempt that
writes nothing costs no row and no write.

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

from sqlalchemy import Dialect, Engine
from sqlalchemy.exc import DBAPIError

from runner.log_buffer import DEFAULT_MAX, END, ROW_MAX, AttemptLog
from runner.store.db_errors import short_error
from runner.store.dialect import dialect_of
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
        self._sql = _Statements(engine.dialect)
        # SQLite: each statement its own transaction (:func:`_each_alone`)
        self._serial = dialect_of(engine).serial_writes
        if self._serial:
            self._sql.max_bytes = STATEMENT_BYTES

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
            inserts: list[tuple[Any, ...]] = []
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
                        (item.instance_id, item.attempt, seq, stream, at, offset, bytes(data))
                    )
                if keep_from > max(item.deleted_to, item.head):
                    deletes.append((item, keep_from))
            if again:
                with self._lock:
                    self._queued.extend(again)
            # one statement each for the rows and the dropped parts, their SQL text
            # made before the transaction: every statement is a GIL hand-over while the
            # write lock is held (executemany: one a row), and a loop busy reading pipes
            # keeps the GIL up to its switch interval each time; SQLAlchemy's multi-row
            # VALUES, compiled anew for each batch, cost ~10 ms of the GIL a batch
            # (docs/performance.md, "Attempt logs: pipes read as data comes, followers
            # woken by commits")
            drops = [(i.instance_id, i.attempt, i.head, keep_from) for i, keep_from in deletes]
            statements = self._sql.statements(inserts, drops)
            if self._serial:
                _each_alone(self.engine, statements)
            else:
                with self.engine.begin() as conn:
                    for statement, args in statements:
                        conn.exec_driver_sql(statement, args)
                    if inserts:
                        notify_logs(conn)
            for item, keep_from in deletes:
                item.deleted_to = keep_from
            return len(inserts)


def _each_alone(engine: Engine, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Run each of ``statements`` (SQLite) as a transaction of its own, in autocommit on
    the driver's connection: SQLite takes its write lock inside the statement's one call
    and gives it up at its end, so the lock is never held while this thread waits for the
    GIL. In one transaction (``BEGIN IMMEDIATE``, the statements, ``COMMIT``) the lock
    was held across each call's hand-over of the GIL, which a loop busy reading 20 pipes
    kept up to its switch interval each: the worker's claims that met it fell back to
    their thread and SQLite's busy-wait steps, 21 ms at the median (``docs/performance.md``,
    "Attempt logs: pipes read as data comes, followers woken by commits"). The rows of a
    batch need no one transaction: a delete of the cap's dropped part not done is done by
    a later batch (``AttemptLog.deleted_to`` moves only after it), and readers take rows
    as they come. No lock of this process is held around a statement: one held across the
    GIL's hand-overs kept a worker's cycle waiting for it several ms at a time (p99 of
    new work's start 8-9 ms with 20 handlers writing at full speed, against 5-8 ms
    meeting SQLite's lock alone). Raises the driver's errors (as ``DBAPIError``)."""
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        try:
            for statement, args in statements:
                raw.execute(statement, args)
        except raw.Error as exc:
            raise DBAPIError(statement, args, exc) from exc


#: Bytes of log data one statement stores at most on SQLite: each statement holds the
#: write lock while SQLite copies them, ~1 ms for
#: this much on a quiet machine, so a claim waits no longer than that for the writer.
STATEMENT_BYTES = 128 << 10
#: Rows (or attempts) one statement of the writer holds at most: within SQLite's 32,766
#: and PostgreSQL's 65,535 parameters.
PER_STATEMENT = 512
#: The columns of the writer's rows, in the order of its tuples.
COLUMNS = ("instance_id", "attempt", "seq", "stream", "at", "offset", "data")


class _Statements:
    """The writer's statements as SQL text in ``dialect``'s parameter style, each made
    once per row count: multi-row ``INSERT`` s of ``attempt_logs`` rows (:data:`COLUMNS`),
    ``DELETE`` s of the rows the cap dropped (``instance_id, attempt, head, keep_from``
    an attempt; the end row stays)."""

    def __init__(self, dialect: Dialect) -> None:
        self._mark = "?" if dialect.paramstyle == "qmark" else "%s"
        q = dialect.identifier_preparer.quote
        self._cols = ", ".join(q(c) for c in COLUMNS)
        self._offset = q("offset")
        self._table = q(attempt_logs.name)
        self._made: dict[tuple[str, int], str] = {}
        #: bytes of log data a statement holds at most (0: no bound); set on SQLite
        self.max_bytes = 0

    def statements(
        self, inserts: list[tuple[Any, ...]], drops: list[tuple[int, int, int, int]]
    ) -> list[tuple[str, tuple[Any, ...]]]:
        """``(sql, parameters)`` of each statement storing ``inserts`` and deleting
        ``drops``, in that order."""
        out = []
        for kind, parts in (("insert", self._parts(inserts)), ("delete", self._parts(drops))):
            for part in parts:
                out.append((self._text(kind, len(part)), tuple(v for r in part for v in r)))
        return out

    def _parts(self, rows: list[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
        """``rows`` in statements of at most :data:`PER_STATEMENT` rows and, with
        :attr:`max_bytes`, about that many bytes of log data (a row's last value)."""
        if not self.max_bytes:
            return [rows[k : k + PER_STATEMENT] for k in range(0, len(rows), PER_STATEMENT)]
        parts: list[list[tuple[Any, ...]]] = []
        part: list[tuple[Any, ...]] = []
        size = 0
        for row in rows:
            if part and (len(part) >= PER_STATEMENT or size >= self.max_bytes):
                parts.append(part)
                part, size = [], 0
            part.append(row)
            last = row[-1]
            size += len(last) if isinstance(last, bytes) else 0
        if part:
            parts.append(part)
        return parts

    def _text(self, kind: str, n: int) -> str:
        found = self._made.get((kind, n))
        if found is None:
            m, off = self._mark, self._offset
            if kind == "insert":
                row = "(" + ", ".join([m] * len(COLUMNS)) + ")"
                found = f"INSERT INTO {self._table} ({self._cols}) VALUES " + ", ".join([row] * n)
            else:
                one = f"(instance_id = {m} AND attempt = {m} AND {off} >= {m} AND {off} < {m})"
                found = (
                    f"DELETE FROM {self._table} WHERE stream <> {END} AND ("
                    + " OR ".join([one] * n)
                    + ")"
                )
            self._made[(kind, n)] = found
        return found


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
