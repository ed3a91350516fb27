"""The database's size on disk, and giving pruned space back to the file system.

SQLite: a file made by this flowrun has incremental auto-vacuum (``runner.store.db`` sets
it before the first table), so the pages a prune frees go back to the file system a few
at a time (:func:`vacuum_step`, ``PRAGMA incremental_vacuum``) without the whole-file
rewrite of ``VACUUM``; with WAL the file shrinks at the next complete checkpoint. A file
made before has none: :func:`convert` turns it on, once, with one ``VACUUM`` (which
rewrites the file under the write lock and needs its size in free disk space:
``flowrun prune --vacuum``). PostgreSQL: autovacuum makes deleted rows' space reusable
(the files do not shrink but stop growing). Where it does not run, for the whole server
(``autovacuum = off``) or for a table (``autovacuum_enabled = false``), nothing frees the
dead row versions of the daemons' updates and the pruner's deletes, and the database
grows for ever, however short the retention: :func:`unvacuumed` names those of
flowrun's tables, and :func:`vacuum_tables` runs a plain ``VACUUM (ANALYZE)`` on them
(never ``VACUUM FULL``: it takes no lock writers wait for).
"""

from __future__ import annotations

import sqlite3
from typing import Any, cast

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from runner.store.db import reading
from runner.store.dialect import dialect_of
from runner.store.tables import metadata

#: ``PRAGMA auto_vacuum`` values.
NONE, FULL, INCREMENTAL = 0, 1, 2


def database_bytes(engine: Engine) -> int:
    """The database's size in bytes: SQLite's pages (``page_count * page_size``, the
    WAL not included), PostgreSQL's ``pg_database_size``."""
    with reading(engine) as conn:
        if dialect_of(engine).in_process:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            return int(pages) * int(size)
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def auto_vacuum(engine: Engine) -> int | None:
    """SQLite's auto-vacuum mode (:data:`NONE`, :data:`FULL`, :data:`INCREMENTAL`);
    ``None`` on PostgreSQL."""
    if not dialect_of(engine).in_process:
        return None
    with reading(engine) as conn:
        return int(conn.exec_driver_sql("PRAGMA auto_vacuum").scalar_one())


def free_pages(engine: Engine) -> int:
    """SQLite pages on the free list (0 on PostgreSQL)."""
    if not dialect_of(engine).in_process:
        return 0
    with reading(engine) as conn:
        return int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one())


def vacuum_step(engine: Engine, pages: int = 2000) -> int:
    """Give up to ``pages`` free pages back to the file system in one short write
    transaction (SQLite with incremental auto-vacuum; elsewhere a no-op). Returns how
    many pages were free before the step."""
    if auto_vacuum(engine) != INCREMENTAL:
        return 0
    before = free_pages(engine)
    if before:
        raw = engine.raw_connection()
        try:  # its own autocommit transaction; executescript steps it to the end (a
            # plain execute frees one page per step)
            sqlite = cast(sqlite3.Connection, raw.driver_connection)
            sqlite.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
        finally:
            raw.close()
    return before


def convert(engine: Engine) -> bool:
    """Turn a SQLite file without auto-vacuum to incremental auto-vacuum with one
    ``VACUUM`` (which also gives every free page back). Returns ``False`` when there is
    nothing to do (already incremental, or PostgreSQL)."""
    mode = auto_vacuum(engine)
    if mode is None or mode == INCREMENTAL:
        return False
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("VACUUM")
        cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        cur.close()
    finally:
        raw.close()
    return True


#: flowrun's tables (``tables.metadata``), sorted.
TABLES = tuple(sorted(metadata.tables))

#: ``autovacuum_enabled`` values that turn it off for a table (PostgreSQL's booleans).
_OFF = frozenset(("false", "off", "no", "0", "f", "n"))


def unvacuumed(engine: Engine) -> list[str]:
    """PostgreSQL: those of :data:`TABLES` that autovacuum leaves alone, sorted: every
    one when the server's ``autovacuum`` setting is off, else those whose storage
    parameter ``autovacuum_enabled`` is false. ``[]`` on SQLite, and for tables not
    made yet."""
    if dialect_of(engine).in_process:
        return []
    names = list(TABLES)
    with reading(engine) as conn:
        server_on = conn.execute(text("SELECT current_setting('autovacuum')")).scalar_one()
        rows = conn.execute(
            text(
                "SELECT n, c.reloptions FROM unnest(CAST(:names AS text[])) AS n"
                " JOIN pg_class c ON c.oid = to_regclass(quote_ident(n))"
            ),
            {"names": names},
        ).all()
    if server_on != "on":
        return sorted(n for n, _ in rows)
    return sorted(n for n, opts in rows if _disabled(opts or []))


def _disabled(reloptions: list[str]) -> bool:
    """A table's storage parameters (``["autovacuum_enabled=false", ...]``) turn
    autovacuum off."""
    for option in reloptions:
        key, _, value = option.partition("=")
        if key.strip().lower() == "autovacuum_enabled":
            return value.strip().lower() in _OFF
    return False


def vacuum_tables(engine: Engine, names: list[str], stopped=lambda: False) -> list[str]:
    """PostgreSQL: ``VACUUM (ANALYZE)`` each of ``names`` (tables of this database), one
    statement each in autocommit (``VACUUM`` runs outside a transaction), stopping
    before the next one once ``stopped()`` is true. Returns the names vacuumed. A table
    this role does not own is skipped by the server with a warning of its own (no
    error). Raises ``DBAPIError`` when the database fails."""
    done: list[str] = []
    if not names or dialect_of(engine).in_process:
        return done
    quote = engine.dialect.identifier_preparer.quote
    raw = engine.raw_connection()
    try:
        pg: Any = raw.driver_connection  # a psycopg connection
        pg.rollback()  # the pool's ping may have begun a transaction
        pg.autocommit = True
        try:
            for name in names:
                if stopped():
                    break
                pg.execute(f"VACUUM (ANALYZE) {quote(name)}")
                done.append(name)
        finally:
            pg.autocommit = False
    except engine.dialect.loaded_dbapi.Error as exc:
        raw.invalidate(exc)
        raise DBAPIError.instance(
            "VACUUM", None, exc, engine.dialect.loaded_dbapi.Error, dialect=engine.dialect
        ) from exc
    finally:
        raw.close()
    return done
