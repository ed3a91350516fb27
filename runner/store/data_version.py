"""SQLite's change counter: has anyone committed to the database since I last looked?

``PRAGMA data_version`` on a connection of its own changes whenever any other connection,
of this process or another, commits a change to the database file (SQLite's "file change
counter" as seen by one connection). Reading it takes microseconds and no lock, where
even the cheapest read through SQLAlchemy takes a transaction and a few hundred
microseconds. An idle worker on SQLite reads it before each look for due work, and an
idle rule engine before each look for pending events: while it has not changed (and no
known due time has come), the look would find what the last one found, so it is skipped.
PostgreSQL has ``LISTEN/NOTIFY`` instead (``runner.store.notify``).
"""

from __future__ import annotations

import sqlite3
import threading

from sqlalchemy import Engine

from runner.store.db import file_sibling_ok


class DataVersion:
    """``PRAGMA data_version`` of the SQLite file ``path`` on a private connection.

    :meth:`read` returns the counter (an int; any change means another connection
    committed since the previous read; the first value means nothing by itself), or
    ``None`` when the file cannot be read (then nothing may be skipped); it may be called
    from any thread (a lock guards the connection). :meth:`close` when done. Raises
    ``sqlite3.Error`` when the file cannot be opened.
    """

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, uri=path.startswith("file:")
        )
        self._lock = threading.Lock()

    def read(self) -> int | None:
        """The counter now, or ``None`` if the file cannot be read."""
        with self._lock:
            try:
                return self._conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error:
                return None

    def close(self) -> None:
        """Close the private connection (idempotent)."""
        with self._lock:
            self._conn.close()


def data_version(engine: Engine) -> DataVersion | None:
    """A :class:`DataVersion` on ``engine``'s SQLite file, or ``None`` for PostgreSQL, an
    in-memory database, or a file that cannot be opened. The caller closes it."""
    if not file_sibling_ok(engine):
        return None
    try:
        return DataVersion(engine.url.database or "")
    except sqlite3.Error:
        return None
