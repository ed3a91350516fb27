"""The database's size on disk, and giving pruned space back to the file system.

SQLite: a file made by this flowrun has incremental auto-vacuum (``runner.store.db`` sets
it before the first table), so the pages a prune frees go back to the file system a few
at a time (:func:`vacuum_step`, ``PRAGMA incremental_vacuum``) without the whole-file
rewrite of ``VACUUM``; with WAL the file shrinks at the next complete checkpoint. A file
made before has none: :func:`convert` turns it on, once, with one ``VACUUM`` (which
rewrites the file under the write lock and needs its size in free disk space:
``flowrun prune --vacuum``). PostgreSQL: autovacuum makes deleted rows' space reusable
(the files do not shrink but stop growing); nothing to do here.
"""

from __future__ import annotations

import sqlite3
from typing import cast

from sqlalchemy import Engine, text

from runner.store.db import reading
from runner.store.dialect import dialect_of

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
