"""Create and upgrade the schema with alembic, programmatically (no ``alembic.ini``).

:func:`upgrade` is what ``runner.store.db.make_engine(create=True)`` calls. It runs in ONE
transaction that first takes a migration lock, so any number of processes may start at
once against a new or old database:

- PostgreSQL: ``pg_advisory_xact_lock`` (released by the commit); the others wait, then
  find the schema at head and do nothing. DDL is transactional, so a failed upgrade leaves
  the database as it was.
- SQLite: the engine opens every transaction with ``BEGIN IMMEDIATE`` (see ``runner.store.db``),
  which already serializes writers; SQLite DDL is transactional too.

A database made by ``metadata.create_all`` before migrations existed has the tables but no
``alembic_version``: it is recognised by its fingerprint (:data:`LEGACY_FINGERPRINTS`),
stamped at the revision it matches, then upgraded like any other.

The migrations live in ``runner/store/migrations/`` (shipped as package data).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from runner.store.db import reading
from runner.store.dialect import dialect_of
from runner.store.revision import MIGRATIONS, MigrationError, latest_revision

if TYPE_CHECKING:  # alembic is imported only when there is something to migrate
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("flowrun.migrate")

#: Key of the PostgreSQL advisory lock held while migrating ("flowrun" in ASCII).
LOCK_KEY = int.from_bytes(b"flowrun", "big")


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic ``Config`` for flowrun's migrations, built in memory.

    Args:
        connection: when given, ``env.py`` runs the migrations on it (inside the caller's
            transaction) instead of opening its own.
    """
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.lru_cache(maxsize=1)
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head() -> str:
    """The newest revision this flowrun knows."""
    rev = _script().get_current_head()
    assert rev is not None, "runner/store/migrations has no revision"
    return rev


def current(conn: Connection) -> str | None:
    """The revision stamped in the database (``None``: never migrated)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def stamped(engine: Engine) -> list[str]:
    """The revisions in ``engine``'s ``alembic_version`` table (empty when there is none),
    read without a lock or alembic: one plain read transaction."""
    with reading(engine) as conn:
        if not inspect(conn).has_table("alembic_version"):
            return []
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def _has_unique(conn: Connection, table: str, name: str) -> bool:
    insp = inspect(conn)
    uniques = {u.get("name") for u in insp.get_unique_constraints(table)}
    indexes = {i.get("name") for i in insp.get_indexes(table) if i.get("unique")}
    return name in uniques | indexes


def _has_column(conn: Connection, table: str, name: str) -> bool:
    insp = inspect(conn)
    return insp.has_table(table) and name in {c["name"] for c in insp.get_columns(table)}


def _has_index(conn: Connection, table: str, name: str) -> bool:
    return name in {i.get("name") for i in inspect(conn).get_indexes(table)}


def _index_columns(conn: Connection, table: str, name: str) -> int:
    """How many columns the index ``name`` of ``table`` has (0: no such index)."""
    found = [i for i in inspect(conn).get_indexes(table) if i.get("name") == name]
    return len(found[0]["column_names"]) if found else 0


#: ``(revision, test)`` for databases made by ``create_all`` before migrations existed,
#: newest first: the first test that holds names the revision to stamp.
LEGACY_FINGERPRINTS: tuple[tuple[str, Callable[[Connection], bool]], ...] = (
    ("0015", lambda c: _has_column(c, "attempts", "log_bytes")),
    ("0014", lambda c: _has_column(c, "instances", "runs_on")),
    ("0013", lambda c: _has_column(c, "instances", "deadline_at")),
    ("0012", lambda c: _has_column(c, "instances", "limit_key")),
    ("0011", lambda c: _has_column(c, "instances", "start_priority")),
    ("0010", lambda c: _index_columns(c, "instances", "ix_instances_flow_status") == 3),
    ("0009", lambda c: _has_column(c, "deliveries", "folded_before")),
    ("0008", lambda c: inspect(c).has_table("attempt_logs")),
    ("0007", lambda c: _has_column(c, "instances", "waiting_for")),
    ("0006", lambda c: _has_column(c, "instances", "history_from")),
    ("0005", lambda c: _has_column(c, "workers", "pid_started")),
    ("0004", lambda c: _has_column(c, "workers", "heartbeat_every")),
    ("0003", lambda c: _has_column(c, "instances", "label")),
    ("0002", lambda c: _has_unique(c, "attempts", "uq_attempts_instance_attempt")),
    ("0001", lambda c: _has_index(c, "attempts", "ix_attempts_instance")),
)


def legacy_revision(conn: Connection) -> str | None:
    """The revision a pre-migrations database matches; ``None`` when it has no tables.

    Raises ``MigrationError`` when flowrun tables exist but match no known schema.
    """
    insp = inspect(conn)
    if not insp.has_table("instances"):
        return None
    if not insp.has_table("attempts"):
        raise MigrationError("database has an 'instances' table but no 'attempts': not flowrun's")
    for revision, matches in LEGACY_FINGERPRINTS:
        if matches(conn):
            return revision
    raise MigrationError(
        "database has flowrun tables of an unknown schema (no alembic_version): "
        "cannot tell which migrations it needs"
    )


def _lock(conn: Connection) -> None:
    if dialect_of(conn).advisory_locks:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
    # SQLite: the transaction began with BEGIN IMMEDIATE (runner.store.db): already exclusive.


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Bring the schema of ``engine``'s database to ``revision`` (default: head).

    Creates every table on an empty database; stamps and upgrades a database made before
    migrations existed; does nothing on one already there. Safe to call from many
    processes at once. Returns the revision the database is at afterwards.

    Raises ``MigrationError`` for a database stamped with a revision this flowrun does not
    know (made by a newer flowrun) or with an unrecognisable schema; SQLAlchemy errors
    (unreachable database, ...) propagate for the caller to report.
    """
    if revision == "head":
        # the usual case, every CLI command's start: already there (one cheap read,
        # no alembic import, no write lock); anything else takes the locked path below
        latest = latest_revision()
        if stamped(engine) == [latest]:
            return latest
    target = head() if revision == "head" else revision
    from alembic import command

    with engine.begin() as conn:
        _lock(conn)
        found = current(conn)
        if found is not None and found == target:
            return found
        if found is not None:
            try:
                _script().get_revision(found)
            except Exception:  # alembic raises several kinds for an unknown id
                raise MigrationError(
                    f"database schema is at revision {found!r}, unknown to this flowrun "
                    f"(its newest is {head()!r}): upgrade flowrun"
                ) from None
        cfg = alembic_config(conn)
        if found is None:
            legacy = legacy_revision(conn)
            if legacy is not None:
                log.info("database made before migrations: stamping it at revision %s", legacy)
                command.stamp(cfg, legacy)
                found = legacy
        if found != target:
            command.upgrade(cfg, target)
            log.info("database schema upgraded from %s to %s", found or "empty", target)
        return target
