"""SQLite's change counter: has anyone committed to the database since I last looked?

``PRAGMA data_version`` on a connection of its own changes whenever any other connection,
of this process or another, commits a change to the database file (SQLite's "file change
counter" as seen by one connection). Reading it takes microseconds and no lock, where
even the cheapest read through SQLAlchemy takes a transaction and a few hundred
microseconds. An idle worker on SQLite reads it before each look for due work, and an
idle rule engine before each look for pending events: while it has not changed (and no
known due time has come), the look would find what the last one found, so it is skipped.
PostgreSQL has ``LISTEN/NOTIFY`` instead (``runner.store.notify``).

On Linux a :class:`CommitBell` says *when* to look: every commit (of any process) writes
the file's ``-wal``, which an inotify descriptor watches, so an idle worker sleeps until
then instead of reading the counter every 50 ms.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading

from sqlalchemy import Engine

from runner.store.db import file_sibling_ok
from runner.store.inotify_sys import IN_MODIFY, add_watch, available, drain, open_fd


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


class CommitBell:
    """An inotify descriptor on the SQLite file ``path``'s ``-wal`` (written by every
    commit, of any process): :attr:`fd` becomes readable after a commit (for the event
    loop's ``add_reader``); :meth:`drain` empties it; :meth:`close` when done. Events
    queue while nobody reads (the kernel folds repeats into one), so a commit between a
    look and the next ``add_reader`` still rings. Raises ``OSError`` when the ``-wal``
    does not exist (the database is not in WAL mode, or no connection is open) or
    inotify cannot be set up, ``RuntimeError`` where there is no inotify.
    """

    def __init__(self, path: str) -> None:
        self.fd = open_fd()
        try:
            add_watch(self.fd, f"{path}-wal", IN_MODIFY)
        except BaseException:
            os.close(self.fd)
            raise

    def drain(self) -> None:
        """Forget the commits rung so far."""
        drain(self.fd)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def commit_bell(engine: Engine) -> CommitBell | None:
    """A :class:`CommitBell` on ``engine``'s SQLite file, or ``None`` (PostgreSQL, memory,
    no ``-wal``, no inotify, a ``file:`` URI). The caller closes it."""
    path = engine.url.database or ""
    if not (available() and file_sibling_ok(engine)) or path.startswith("file:"):
        return None
    try:
        return CommitBell(path)
    except OSError:
        return None
