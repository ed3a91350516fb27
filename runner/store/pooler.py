"""PostgreSQL reached through a transaction-pooling pooler (PgBouncer's ``pool_mode =
transaction``, and the poolers of many managed PostgreSQL services).

Such a pooler hands each transaction of a client to whichever server connection is free,
so nothing that lives in a server session survives a transaction: psycopg's server-side
prepared statements (made from a statement's sixth run on) collide between clients (a
worker runs another client's statement, or fails with "prepared statement ... does not
exist"), and a ``LISTEN`` stops hearing anything once its transaction ends.

How flowrun knows: the URL's ``pooler=`` parameter (``transaction``; ``none`` for a direct
connection or a session-pooling pooler, where a client keeps its server connection), else
the ``pooler`` argument (``--db-pooler``/``FLOWRUN_DB_POOLER``), else ``auto``: on an
engine's first connection the backend process id the server announced at login
(``BackendKeyData``) is compared with ``pg_backend_pid()``. A pooler announces an id of its
own (it answers cancel requests itself), so they differ through one and agree on a direct
connection; a pooler found so is taken for a transaction-pooling one (a session-pooling
one is told with ``pooler=none``). One round trip, on an engine's first connection only.

With a transaction pooler every connection of the engine has psycopg's
``prepare_threshold`` set to ``None`` (nothing prepared on the server), and the daemon
listens on ``--listen-db`` or polls (``runner.service.daemon``).
"""

from __future__ import annotations

import logging
import threading
import weakref

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL

from runner.errors import ConfigError

log = logging.getLogger("flowrun.db")

#: What ``pooler`` may be: find out, a transaction-pooling pooler, or none (a direct
#: connection, or a session-pooling pooler).
POOLERS = ("auto", "transaction", "none")
#: The URL query parameter that says which (removed before the driver sees the URL).
PARAM = "pooler"

_modes: weakref.WeakKeyDictionary[Engine, _Mode] = weakref.WeakKeyDictionary()


def split_pooler(url: URL, pooler: str = "auto") -> tuple[URL, str]:
    """``url`` without its ``pooler=`` parameter, and the pooler it says (else ``pooler``).

    Args:
        url: a parsed SQLAlchemy URL.
        pooler: one of :data:`POOLERS`, used when the URL says nothing.

    Raises:
        ConfigError: either value is not one of :data:`POOLERS` (one line).
    """
    given = url.query.get(PARAM)
    if isinstance(given, tuple):
        given = given[-1]
    if given is not None:
        url = url.difference_update_query([PARAM])
        _check(f"{PARAM}={given}", given)
        return url, given
    _check(f"--db-pooler {pooler}", pooler)
    return url, pooler


def _check(where: str, value: str) -> None:
    if value not in POOLERS:
        raise ConfigError(f"{where}: expected one of {', '.join(POOLERS)}")


class _Mode:
    """One engine's pooler: told (``transaction``/``none``) or found on its first connection."""

    def __init__(self, pooler: str) -> None:
        self.value = None if pooler == "auto" else pooler
        self.lock = threading.Lock()

    def on_connect(self, dbapi_conn, _record) -> None:
        if self.value is None:
            with self.lock:
                if self.value is None:
                    self.value = "transaction" if behind_pooler(dbapi_conn) else "none"
                    if self.value == "transaction":
                        log.debug("found a pooler between flowrun and PostgreSQL")
        if self.value == "transaction":
            dbapi_conn.prepare_threshold = None  # nothing prepared on the server


def install(engine: Engine, pooler: str) -> None:
    """Make ``engine`` (PostgreSQL through psycopg) follow ``pooler`` (one of
    :data:`POOLERS`): with ``transaction`` (told or found), none of its connections
    prepares statements on the server."""
    mode = _Mode(pooler)
    _modes[engine] = mode
    event.listen(engine, "connect", mode.on_connect)


def pooler_of(engine: Engine) -> str:
    """``"transaction"`` when ``engine`` reaches PostgreSQL through a transaction-pooling
    pooler (told or found), else ``"none"`` (also for SQLite).

    Connects once when the engine never has (to find out); raises SQLAlchemy's
    ``OperationalError`` when the database cannot be reached then.
    """
    mode = _modes.get(engine)
    if mode is None:
        return "none"
    if mode.value is None:
        with engine.connect():
            pass
    return mode.value or "none"


def behind_pooler(dbapi_conn) -> bool:
    """True when a psycopg connection goes through a pooler: the backend process id the
    server announced at login differs from the one its statements run in.

    Runs one statement in autocommit (no transaction left open: through a transaction
    pooler an open one would hold a server connection). Raises psycopg's errors.
    """
    autocommit = dbapi_conn.autocommit
    dbapi_conn.autocommit = True
    try:
        cursor = dbapi_conn.cursor()
        try:
            (pid,) = cursor.execute("SELECT pg_backend_pid()").fetchone()
        finally:
            cursor.close()
    finally:
        dbapi_conn.autocommit = autocommit
    return int(pid) != dbapi_conn.info.backend_pid
