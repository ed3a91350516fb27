"""The read side's one door to SQL: plain parameterised SQL text run by either driver.

The read queries (``runner.ops.queries``, ``runner.ops.detail``, ``runner.ops.liveness``)
are SQL text with named ``:param`` placeholders, a style both stdlib ``sqlite3`` and
SQLAlchemy's ``text()`` accept. One :class:`Reader` runs them; there are two:

- :class:`SqliteReader`: stdlib ``sqlite3`` on a SQLite file opened read-only
  (``file:...?mode=ro``), a 30 s busy timeout and plain deferred ``BEGIN`` snapshots
  (under WAL a read never blocks a writer), as ``runner.store.db.read_engine``. It needs
  neither SQLAlchemy nor SQLModel: ``flowrun ls`` on SQLite starts in a third of the time
  (``docs/performance.md``, "The read side without SQLAlchemy"). :func:`open_sqlite`
  opens one only on a file whose schema is at this flowrun's revision; anything else is
  left to ``make_engine`` (which creates, upgrades or refuses it with one clear line).
- :class:`EngineReader`: a SQLAlchemy ``Engine`` (PostgreSQL, the console's read engine,
  every caller that holds an engine), each snapshot one ``runner.store.db.reading``
  connection.

Both hand back driver rows (tuples) and decode JSON columns with the same loader as the
worker's prepared statements (``Dialect.json_loader``; on SQLite
``runner.store.json_codec.sqlite_json_loader``), so every path reads the same values.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast
from urllib.parse import quote

from runner.store.json_codec import sqlite_json_loader

if TYPE_CHECKING:
    from sqlalchemy import Engine

#: A snapshot's statement runner: ``run(sql, params)`` → every row as a tuple.
Run = Callable[[str, Mapping[str, Any]], list[Sequence[Any]]]

#: The columns of the tables the read side reads, in the tables' order
#: (``runner.store.tables``; a unit test checks they match).
INSTANCE_COLUMNS = (
    "id",
    "flow",
    "version",
    "state",
    "status",
    "data",
    "due_at",
    "locked_by",
    "locked_until",
    "fence",
    "attempts",
    "errors",
    "restarts",
    "state_errors",
    "state_restarts",
    "running_attempt",
    "last_error",
    "state_changed",
    "state_attempted",
    "created_at",
    "updated_at",
    "event_id",
    "label",
    "history_from",
    "pool",
    "pool_slots",
    "waiting_for",
    "wait_due",
    "priority",
    "start_priority",
    "limit_key",
    "runs_on",
    "route_event",
    "deadline_at",
)
ATTEMPT_COLUMNS = (
    "id",
    "instance_id",
    "attempt",
    "state",
    "worker",
    "fence",
    "started_at",
    "finished_at",
    "outcome",
    "to_state",
    "error",
    "checkpoint",
    "log_bytes",
)
COMMAND_COLUMNS = (
    "id",
    "instance_id",
    "command",
    "args",
    "source",
    "created_at",
    "status",
    "result",
)
EVENT_COLUMNS = ("id", "sensor", "key", "payload", "created_at", "handled_at", "action")
#: The columns of a delivery ``flowrun events`` shows (``runner.store.tables.Delivery``).
DELIVERY_COLUMNS = (
    "id",
    "event_id",
    "rule",
    "target",
    "status",
    "attempts",
    "last_result",
    "delivered_at",
    "due_at",
    "suppressed",
    "folded_before",
)
WORKER_COLUMNS = (
    "id",
    "host",
    "pid",
    "started_at",
    "heartbeat_at",
    "running",
    "stopped_at",
    "heartbeat_every",
    "boot_id",
    "pid_started",
    "labels",
)
#: Columns (of any table) holding JSON; no other column shares their names.
JSON_COLUMNS = frozenset(
    {"data", "state_errors", "checkpoint", "args", "payload", "cursor", "starts", "target"}
)


class Reader(Protocol):
    """What the read queries need from a database.

    Attributes:
        load_json: turns a JSON column's driver value into Python.
    """

    load_json: Callable[[Any], Any]

    def snapshot(self) -> AbstractContextManager[Run]:
        """A context manager yielding a :data:`Run`: every statement run through it reads
        the same snapshot (one read transaction, rolled back at the end)."""
        ...


class SqliteReader:
    """A :class:`Reader` on one stdlib ``sqlite3`` connection (read-only; see
    :func:`open_sqlite`). Raises ``sqlite3.Error`` when the file cannot be read."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.load_json = sqlite_json_loader()

    @contextmanager
    def snapshot(self) -> Iterator[Run]:
        """One deferred read transaction (never the write lock)."""
        conn = self.conn
        conn.execute("BEGIN")

        def run(sql: str, params: Mapping[str, Any] | None = None) -> list[Sequence[Any]]:
            return conn.execute(sql, params or {}).fetchall()

        try:
            yield run
        finally:
            conn.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection; raises nothing."""
        self.conn.close()


class EngineReader:
    """A :class:`Reader` on a SQLAlchemy ``Engine`` (statements as ``text()``). Raises
    ``sqlalchemy.exc.SQLAlchemyError`` when the database cannot be read."""

    def __init__(self, engine: Engine) -> None:
        from runner.store.dialect import dialect_of

        self.engine = engine
        self.load_json = dialect_of(engine).json_loader()

    @contextmanager
    def snapshot(self) -> Iterator[Run]:
        """One read transaction on a ``runner.store.db.reading`` connection."""
        from sqlalchemy import text

        from runner.store.db import reading

        with reading(self.engine) as conn:

            def run(sql: str, params: Mapping[str, Any] | None = None) -> list[Sequence[Any]]:
                return conn.execute(text(sql), params or {}).all()

            yield run


#: What the read queries take: an ``Engine`` or a :class:`Reader`.
EngineOrReader: TypeAlias = "Engine | Reader"


def reader_of(db: EngineOrReader) -> Reader:
    """``db`` itself when it is a :class:`Reader`, else an :class:`EngineReader` on it
    (an ``Engine``): the read queries take either."""
    if hasattr(db, "snapshot"):  # the Reader protocol (an Engine has no snapshot)
        return cast(Reader, db)
    return EngineReader(db)


def as_dicts(
    reader: Reader, keys: Sequence[str], rows: list[Sequence[Any]]
) -> list[dict[str, Any]]:
    """``rows`` (tuples of the ``keys`` columns) as dicts, JSON columns decoded."""
    out = [dict(zip(keys, r, strict=True)) for r in rows]
    json_keys = [k for k in keys if k in JSON_COLUMNS]
    if json_keys:
        load = reader.load_json
        for d in out:
            for k in json_keys:
                d[k] = load(d[k])
    return out


def columns(keys: Sequence[str]) -> str:
    """``keys`` as a select list, each checked against the known column names (the SQL
    text is built from them; raises ``ValueError`` for any other)."""
    known = {
        *INSTANCE_COLUMNS,
        *ATTEMPT_COLUMNS,
        *COMMAND_COLUMNS,
        *EVENT_COLUMNS,
        *DELIVERY_COLUMNS,
    }
    bad = [k for k in keys if k not in known and k not in WORKER_COLUMNS]
    if bad:
        raise ValueError(f"unknown columns {bad}")
    return ", ".join(keys)


def sqlite_file(url: str) -> str | None:
    """The file of a plain SQLite file URL (``sqlite:///path``, ``sqlite:////abs``), or
    ``None`` for anything the fast path leaves to SQLAlchemy: another database, memory,
    query parameters, ``file:`` URIs, percent escapes, ``~``."""
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            path = url[len(prefix) :]
            break
    else:
        return None
    if not path or path == ":memory:" or path.startswith(("file:", "~")):
        return None
    if any(ch in path for ch in "?%#"):
        return None
    return path


def open_sqlite(url: str, revision: str) -> SqliteReader | None:
    """A read-only :class:`SqliteReader` on the SQLite file of ``url``, or ``None``.

    ``None`` (nothing opened) unless ``url`` names a SQLite file (:func:`sqlite_file`)
    that exists, can be read and is stamped with exactly ``revision`` (its
    ``alembic_version`` table): a missing, empty, older, newer or unmigrated database, or
    one that is not a database at all, is for ``runner.store.db.make_engine`` to create,
    upgrade or refuse, with the same lines as before. Raises nothing.
    """
    path = sqlite_file(url)
    if path is None or not os.path.isfile(path):
        return None
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    try:
        conn = sqlite3.connect(
            uri, uri=True, timeout=30.0, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA query_only=ON")
        found = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    except sqlite3.Error:
        conn.close()
        return None
    if found != [revision]:
        conn.close()
        return None
    return SqliteReader(conn)
