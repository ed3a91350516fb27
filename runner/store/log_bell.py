"""Wakes a follower of an attempt log when the log writer commits, instead of polling.

On SQLite the commit bell (``runner.store.data_version.CommitBell``: the file's ``-wal``
watched by inotify) rings on every commit of any process; on PostgreSQL the log writer
sends ``NOTIFY flowrun_logs`` in each batch's transaction (:func:`notify_logs`) and the
follower ``LISTEN`` s on a connection of its own: ``--listen-db``'s when given, else the
database URL's own, unless that goes through a transaction-pooling pooler
(``runner.store.pooler``), where a ``LISTEN`` hears nothing once its transaction ends and
would stay on a server connection other clients are handed. Where there is no bell (no
inotify, a pooler and no ``--listen-db``), :meth:`LogBell.wait` just waits its timeout:
polling.
"""

from __future__ import annotations

import contextlib
import select
import time
from typing import Any

from sqlalchemy import Connection, Engine, text

from runner.store.data_version import CommitBell, commit_bell
from runner.store.db import dialect_of
from runner.store.notify import libpq_url
from runner.store.pooler import pooler_of

#: The channel the log writer notifies on PostgreSQL (no payload).
LOGS_CHANNEL = "flowrun_logs"
#: Seconds between two looks at least, however often the bell rings (every commit of
#: every daemon rings it on SQLite).
MIN_GAP = 0.02

_NOTIFY = text(f"SELECT pg_notify('{LOGS_CHANNEL}', '')")


def notify_logs(conn: Connection) -> None:
    """Tell followers that log rows were stored, once ``conn``'s transaction commits
    (a no-op on SQLite, where the commit itself rings)."""
    if dialect_of(conn).notify:
        conn.execute(_NOTIFY)


class LogBell:
    """Wait for the next commit of log rows on ``engine``'s database (or a timeout).

    Opened with what is there: an inotify bell (SQLite), a ``LISTEN`` connection
    (PostgreSQL; on ``listen_url``, a checked ``--listen-db``, when given; none through a
    transaction pooler without it), or nothing (then waits are plain sleeps). Raises
    nothing; :meth:`close` when done.
    """

    def __init__(self, engine: Engine, listen_url: str | None = None) -> None:
        self._bell: CommitBell | None = None
        self._pg: Any = None
        self._last = 0.0
        if dialect_of(engine).notify:
            with contextlib.suppress(Exception):  # no LISTEN: poll
                import psycopg

                url = listen_url
                if url is None and pooler_of(engine) != "transaction":
                    url = engine.url.render_as_string(hide_password=False)
                if url is not None:
                    self._pg = psycopg.connect(libpq_url(url), autocommit=True)
                    self._pg.execute(f"LISTEN {LOGS_CHANNEL}")
        else:
            self._bell = commit_bell(engine)

    def wait(self, timeout: float) -> bool:
        """Return after the next commit (of log rows on PostgreSQL, of anything on
        SQLite) or ``timeout`` seconds, whichever is first; never sooner than
        :data:`MIN_GAP` after the previous return. True when a commit rang."""
        gap = self._last + MIN_GAP - time.monotonic()
        if gap > 0:
            time.sleep(gap)
            timeout -= gap
        rang = False
        if self._bell is not None:
            ready, _, _ = select.select([self._bell.fd], [], [], max(0.0, timeout))
            if ready:
                self._bell.drain()
                rang = True
        elif self._pg is not None:
            try:
                for _ in self._pg.notifies(timeout=max(0.0, timeout), stop_after=1):
                    rang = True
            except Exception:  # noqa: BLE001 - the connection went: poll from now on
                self._pg = None
        else:
            time.sleep(max(0.0, timeout))
        self._last = time.monotonic()
        return rang

    def close(self) -> None:
        """Close the bell or the connection (idempotent)."""
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.close()
            self._pg = None
