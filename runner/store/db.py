"""Every database engine flowrun opens is made here (statements prepared for one:
``runner.store.prepared``).

SQLite (the default): a file with WAL, ``busy_timeout`` and ``synchronous=NORMAL``; every
transaction starts with ``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a
read lock to a write lock; its siblings on the same file are the worker's
:func:`no_wait_engine` and the console's :func:`read_engine`. PostgreSQL:
``postgresql+psycopg://`` URLs, the engine made by ``runner.store.pg_engine``. What
differs between the two beyond the engine lives in ``runner.store.dialect``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError,
    OperationalError,
    SQLAlchemyError,
)

from runner.errors import ConfigError
from runner.store.db_errors import first_line
from runner.store.dialect import dialect_of
from runner.store.pg_engine import pg_engine
from runner.store.pooler import install as install_pooler
from runner.store.pooler import split_pooler
from runner.store.wal import SAFETY_PAGES, enter_wal

DEFAULT_URL = "sqlite:///.flowrun/flowrun.db"

#: PostgreSQL: the most connections one engine opens for statements (``--pool-size``). Up
#: to two are kept open once opened (a worker's two cycles in flight,
#: ``engine.cycle_runner``); the others are opened while several parts of a process need
#: one at once and closed when returned. A daemon adds one ``LISTEN`` connection
#: (``store.notify``).
DEFAULT_POOL = 2
#: ``application_name`` of PostgreSQL connections when the caller gives none.
APPLICATION = "flowrun"
#: Seconds one of a worker's statements may take on PostgreSQL: the server cancels one
#: running longer (``statement_timeout``, set for each cycle's transaction by
#: ``runner.store.leases.by_index``), and the worker breaks off a call whose answer does
#: not come (``runner.engine.db_thread``: a silent network) a little later.
STATEMENT_TIMEOUT = 4.5
#: Seconds a worker cycle's transaction may sit idle between statements on PostgreSQL
#: before the server ends its session (``idle_in_transaction_session_timeout``, set for
#: each cycle's transaction with ``STATEMENT_TIMEOUT``): a daemon frozen mid-cycle
#: (SIGSTOP, a VM paused) would otherwise hold its row locks, a pool's among them, and
#: stall every other daemon's claims of that pool until it resumed. The transaction is
#: rolled back; the frozen daemon, once resumed, meets a closed connection, backs off and
#: retries the cycle (its outcomes are kept; its claims are fenced like any others).
#: 15 s: a process starved of CPU (32 daemons starting on 2 cores) is given as long to
#: finish a database call (``engine.db_thread``: ``CALL_TIMEOUT`` x ``STARVED``).
IDLE_IN_TRANSACTION = 15.0


def bound_idle(conn: Connection) -> None:
    """PostgreSQL: the rest of the caller's transaction ends its session when it sits idle
    past :data:`IDLE_IN_TRANSACTION` (``SET LOCAL``, one round trip); nothing on SQLite.
    For a transaction outside a worker's cycle that locks a row other daemons' claims
    wait for: a flow limit's, locked by a rule starting an instance under ``on_limit:
    skip`` (``store.flow_limits.refusal``). A worker's cycle sets it in the statement it
    sends first (``leases.by_index``)."""
    if dialect_of(conn).skip_locked:
        ms = str(int(IDLE_IN_TRANSACTION * 1000))
        conn.exec_driver_sql(
            "SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)", {"ms": ms}
        )


def redact(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for logs and errors).

    A ``password=`` query parameter is masked too. When the string does not parse, or has
    more than one ``@`` (an unencoded ``@`` in a password), everything between the scheme
    and the LAST ``@`` except the user name is masked, so no part of a password can leak.
    """
    url = _mask_query_password(url)
    if url.count("@") <= 1:
        try:
            return _mask_query_password(make_url(url).render_as_string(hide_password=True))
        except (ArgumentError, ValueError):
            pass
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    creds, at, tail = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = creds.partition(":")
    masked = f"{user}:***" if colon else creds
    return f"{scheme}{sep}{masked}@{tail}"


def _mask_query_password(url: str) -> str:
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def normalize_url(url: str) -> str:
    """Map ``postgresql://`` and ``postgres://`` to the psycopg 3 driver."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def make_engine(
    url: str = DEFAULT_URL,
    *,
    create: bool = True,
    readonly: bool = False,
    pool: int = DEFAULT_POOL,
    application_name: str = APPLICATION,
    pooler: str = "auto",
) -> Engine:
    """Create an engine for ``url`` and (with ``create``) create or upgrade the schema.

    ``create`` runs the alembic migrations (``runner.store.migrate.upgrade``): an empty database
    gets every table, an older one is upgraded, one made before migrations is stamped.

    ``readonly`` makes an engine that cannot write (and implies no ``create``): on SQLite
    its transactions are plain deferred ``BEGIN`` with ``query_only`` (see
    :func:`read_engine`), on PostgreSQL ``default_transaction_read_only``.

    PostgreSQL only: ``pool`` is the most connections the engine opens at once (see
    :func:`pg_engine`); ``application_name`` names them in ``pg_stat_activity`` unless the
    URL sets one; ``pooler`` (``auto``, ``transaction``, ``none``) says whether it is
    reached through a transaction-pooling pooler, unless the URL's ``pooler=`` parameter
    does (``runner.store.pooler``: then nothing is prepared on the server).

    For a SQLite file URL the parent folder is created (not with ``readonly``). Raises
    ``ConfigError`` (one clear line, password redacted) for a malformed URL, a folder
    that cannot be created or an unreachable database.
    """
    url = normalize_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"bad database URL {redact(url)!r}: {exc}") from None
    if "@" in (parsed.host or ""):
        raise ConfigError(
            f"bad database URL {redact(url)!r}: write an '@' in the user name or password as %40"
        )
    stripped, pooler = split_pooler(parsed, pooler)
    if stripped is not parsed:  # the driver must not see ``pooler=``
        parsed, url = stripped, stripped.render_as_string(hide_password=False)
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = _sqlite_engine(url, parsed.database, readonly=readonly)
        else:
            engine = pg_engine(url, readonly=readonly, pool=pool, application_name=application_name)
            install_pooler(engine, pooler)
    except (ArgumentError, ImportError) as exc:
        raise ConfigError(f"bad database URL {redact(url)!r}: {exc}") from None
    if create and not readonly:
        from runner.store.migrate import upgrade

        try:
            upgrade(engine)
        except ConfigError as exc:
            engine.dispose()
            raise ConfigError(f"database {redact(url)}: {exc}") from None
        except OperationalError as exc:
            engine.dispose()
            raise ConfigError(
                f"cannot reach database {redact(url)}: {first_line(exc.orig or exc)}"
            ) from None
        except SQLAlchemyError as exc:
            engine.dispose()
            raise ConfigError(f"database {redact(url)}: {first_line(exc)}") from None
    return engine


def no_wait_engine(engine: Engine) -> Engine | None:
    """A new sibling of ``engine`` whose writers never wait for a lock, or ``None``.

    SQLite only: the same file with a busy timeout of 0, so ``BEGIN IMMEDIATE`` either
    takes the write lock at once or fails at once (``db_errors.is_busy``). The worker runs its
    database cycle on the event loop through it (no thread hand-off, which on this
    2-core VM cost a third of the time of a cycle) and falls back to its database thread,
    which may wait, when another process holds the lock. ``None`` for PostgreSQL, whose
    statements are network round trips that must not block the loop, and for an
    in-memory SQLite database. The caller owns the sibling (``dispose()`` it when done).

    Its commits leave WAL checkpoints to a :class:`runner.store.wal.WalCheckpointer` (their
    automatic checkpoint is only a safety net, ``wal.SAFETY_PAGES``): the caller runs one.
    """
    if not file_sibling_ok(engine):
        return None  # PostgreSQL, or a second engine would open a different, empty database
    return _sqlite_engine(
        engine.url.render_as_string(hide_password=False),
        engine.url.database,
        timeout=0,
        autocheckpoint=SAFETY_PAGES,
    )


def read_engine(engine: Engine) -> Engine:
    """An engine for reads that never takes SQLite's write lock, or ``engine`` itself.

    ``engine`` (the runner's) begins every transaction ``IMMEDIATE`` (a write lock), which
    would make each read of a console refresh queue behind, and block, the workers. The
    sibling returned for a SQLite file opens plain deferred ``BEGIN`` transactions with
    ``query_only`` and a 30 s busy timeout: under WAL such a read never blocks a writer,
    and it cannot write. For PostgreSQL and an in-memory SQLite database it is ``engine``
    itself. The caller owns a sibling (``dispose()`` it when done); raises nothing
    (connections open lazily).
    """
    if not file_sibling_ok(engine):
        return engine
    return _sqlite_engine(
        engine.url.render_as_string(hide_password=False), engine.url.database, readonly=True
    )


def file_sibling_ok(engine: Engine) -> bool:
    """True when a second engine on ``engine``'s URL reaches the same database: an
    in-process (SQLite) database in a file, not in memory."""
    if not dialect_of(engine).in_process:
        return False
    database = engine.url.database or ""
    return database not in ("", ":memory:") and "mode=memory" not in str(engine.url)


def _sqlite_engine(
    url: str,
    database: str | None,
    timeout: float = 30.0,
    autocheckpoint: int | None = None,
    *,
    readonly: bool = False,
) -> Engine:
    if database and database != ":memory:" and not database.startswith("file:") and not readonly:
        folder = Path(database).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"database {redact(url)}: cannot create its folder {folder}: {exc.strerror or exc}"
            ) from None
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": timeout})
    busy_ms = int(timeout * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - trivial
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_conn.cursor()
        if readonly:
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.execute("PRAGMA query_only=ON")
            cur.close()
            return
        # a new (empty) file gets incremental auto-vacuum, which must be set before its
        # first table: pruned pages can then be given back to the file system
        # (``runner.store.space.vacuum_step``). Only then: on a file that has tables the
        # pragma writes its header, taking the write lock at every connect
        if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        enter_wal(cur, timeout)
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={busy_ms}")
        cur.execute("PRAGMA foreign_keys=ON")
        if autocheckpoint is not None:
            cur.execute(f"PRAGMA wal_autocheckpoint={int(autocheckpoint)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # pragma: no cover - trivial
        # writers take the write lock up front (no deadlocking lock upgrades); readers
        # opened with reading() (or on a read-only engine) take a plain snapshot and never
        # wait on a writer (WAL)
        read = readonly or conn.get_execution_options().get("flowrun_read")
        conn.exec_driver_sql("BEGIN" if read else "BEGIN IMMEDIATE")

    return engine


def reading(engine: Engine):
    """A connection for reads only: on SQLite its transactions do not take the write lock.

    Use as ``with reading(engine) as conn: ...``.
    """
    return engine.connect().execution_options(flowrun_read=True)


def insert_ignore(conn, table, values: dict[str, Any]) -> None:
    """``INSERT ... ON CONFLICT DO NOTHING`` for SQLite and PostgreSQL.

    Args:
        conn: an open ``Connection`` inside the caller's transaction.
        table: a SQLAlchemy ``Table``.
        values: one row as a dict of column name to value.
    """
    conn.execute(dialect_of(conn).insert(table).values(**values).on_conflict_do_nothing())
