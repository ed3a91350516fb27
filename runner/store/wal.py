"""SQLite WAL checkpoints off the worker's event loop.

In WAL mode every commit appends the pages it changed to the ``-wal`` file, and by default
the commit that pushes the file past 1,000 pages also copies them back into the database
file (an automatic checkpoint), inside that commit. The worker commits on its event loop
(``db.no_wait_engine``), so those checkpoints stalled every handler for their duration:
on this 2-core VM about 45% of the cost of a commit, averaged.

:class:`WalCheckpointer` runs ``PRAGMA wal_checkpoint(PASSIVE)`` from its own thread and
connection instead. ``sqlite3`` releases the GIL while SQLite works, so the copy runs on
the other core, and PASSIVE never blocks a writer or a reader. The loop's connections keep
an automatic checkpoint only as a safety net (:data:`SAFETY_PAGES`), for a checkpointer
that cannot keep up. Source: SQLite's "Checkpointing" notes (https://sqlite.org/wal.html:
"run the checkpoint from a separate thread or process").

:func:`enter_wal` switches a connection's file to WAL, waiting out the processes that
switch the same new file at the same moment.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

log = logging.getLogger("flowrun.wal")

#: ``wal_autocheckpoint`` (pages) of the connections a checkpointer relieves: far above
#: SQLite's default of 1,000, so only a checkpointer that fell behind leaves the work to
#: a commit again.
SAFETY_PAGES = 20_000
#: The longest wait (seconds) between two looks of an idle checkpointer: while nobody
#: commits, the wait doubles from ``every`` up to this (far below what fills
#: :data:`SAFETY_PAGES` after a quiet spell).
IDLE_WAIT = 1.0


def enter_wal(cursor: sqlite3.Cursor, timeout: float) -> None:
    """``PRAGMA journal_mode=WAL`` on ``cursor``'s connection, retried for up to
    ``timeout`` seconds (at least 1) while the file is locked.

    Switching a new file to WAL upgrades a read lock to the write lock inside one
    statement; SQLite answers "database is locked" at once there instead of calling the
    busy handler (it could deadlock), so several processes opening a new database at the
    same moment (``flowrun start`` beside a daemon's first start, or upgrading together)
    would fail without the retry. Raises ``sqlite3.OperationalError`` for any other error,
    or when the file stays locked past the timeout.
    """
    deadline = time.monotonic() + max(timeout, 1.0)
    pause = 0.002
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class WalCheckpointer:
    """A daemon thread checkpointing one SQLite file's WAL every ``every`` seconds.

    Args:
        path: the database file (``engine.url.database``).
        every: seconds between checkpoints (a checkpoint of an already copied WAL only
            reads its header).

    ``start()`` once, ``stop()`` when done (joins the thread; idempotent). Errors (a
    locked or missing file) are logged at debug level and retried at the next tick:
    nothing depends on one checkpoint. A look finding nothing committed since the last
    checkpoint (``PRAGMA data_version`` unchanged) checkpoints nothing, and the next
    look waits twice as long, up to :data:`IDLE_WAIT`: an idle daemon's checkpointer
    wakes about once a second, not ten times.
    """

    def __init__(self, path: str, every: float = 0.1) -> None:
        self.path = path
        self.every = every
        self.checkpoints = 0  # completed checkpoint calls (for tests and diagnostics)
        self.looks = 0  # completed looks, a checkpoint or not (for tests and diagnostics)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flowrun-wal", daemon=True)

    def start(self) -> WalCheckpointer:
        """Start the thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close its connection (waits for a checkpoint in progress)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=0, uri=self.path.startswith("file:")
            )
        except sqlite3.Error as exc:
            log.debug("no WAL checkpoints for %s: %s", self.path, exc)
            return
        seen, wait = None, self.every
        try:
            while not self._stop.wait(wait):
                try:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version == seen:  # nothing committed since the last checkpoint
                        wait = min(wait * 2, max(IDLE_WAIT, self.every))
                        continue
                    wait = self.every
                    busy, log_pages, copied = conn.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)"
                    ).fetchone()
                    # a checkpoint a reader held up is tried again at the next look
                    seen = version if not busy and copied == log_pages else None
                    self.checkpoints += 1
                except sqlite3.Error as exc:
                    log.debug("WAL checkpoint of %s failed: %s", self.path, exc)
                finally:
                    self.looks += 1
        finally:
            conn.close()
