"""Which schema revision this flowrun expects, read without alembic or SQLAlchemy.

``runner.store.migrate`` brings a database to this revision; the CLI's read-only fast
path (``runner.store.reader.open_sqlite``) only compares a SQLite file's stamped revision
with it, and leaves any other database (older, newer, unmigrated) to ``migrate``.
"""

from __future__ import annotations

import re
from pathlib import Path

from runner.errors import ConfigError

#: The alembic script folder (``env.py``, ``versions/``).
MIGRATIONS = Path(__file__).resolve().with_name("migrations")


class MigrationError(ConfigError):
    """The schema cannot be brought to this flowrun's head revision (one clear line)."""


def latest_revision() -> str:
    """The head revision read without alembic: the ``revision`` declared by the migration
    file whose name sorts last (``versions/NNNN_*.py``; a unit test checks it equals
    ``runner.store.migrate.head``).

    Raises:
        MigrationError: that file declares no ``revision = '...'``.
    """
    last = max(MIGRATIONS.joinpath("versions").glob("[0-9]*.py"))
    found = re.search(r"^revision(?:: *str)? *= *[\"']([^\"']+)[\"']", last.read_text(), re.M)
    if found is None:
        raise MigrationError(f"{last}: no revision = '...' line")
    return found.group(1)
