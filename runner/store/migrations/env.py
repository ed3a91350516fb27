"""Alembic environment of flowrun.

At run time :func:`runner.store.migrate.upgrade` passes an open connection (already inside the
transaction that holds the migration lock) in ``config.attributes["connection"]``; the
migrations then run on it and the caller commits. From the ``alembic`` command line (for
developers writing a revision) the URL comes from ``-x url=...`` or ``sqlalchemy.url``.
SQLite gets ``render_as_batch`` so a revision can alter tables (SQLite has no ALTER
COLUMN / ADD CONSTRAINT).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from runner.store.dialect import dialect_of
from runner.store.tables import metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=dialect_of(connection).batch_migrations,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the caller's connection, or on one opened from the URL."""
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from runner.store.db import make_engine

    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("give the database with -x url=... (or sqlalchemy.url)")
    engine = make_engine(url, create=False)
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("flowrun migrations run online only (the SQL differs per dialect)")
run_migrations_online()
