"""The read side on PostgreSQL without SQLAlchemy: ``psycopg`` alone, for the CLI.

``flowrun ls``, ``show``, ``explain``, ``events``, ``workers`` and ``pool ls`` are one
process each. Through ``runner.store.db.make_engine`` a PostgreSQL read paid for
SQLAlchemy, SQLModel's tables and alembic's check before its first statement: most of a
second of imports, against tens of milliseconds of SQL on a million instances
(``docs/performance.md``, "The read side without SQLAlchemy"). :func:`open_postgres`
opens a plain ``psycopg`` connection instead, as ``runner.store.reader.open_sqlite`` does
with ``sqlite3`` on a SQLite file, and only on a database stamped with this flowrun's
schema revision: anything else (another revision, no schema, a URL with parameters,
a server that cannot be reached) is left to ``make_engine``, which upgrades, refuses or
reports it with the same one line as before.

The read queries' SQL text uses ``:name`` placeholders (``runner.store.reader``);
:func:`pyformat` turns them into psycopg's ``%(name)s``, as SQLAlchemy's ``text()``
does. Each snapshot is one ``REPEATABLE READ READ ONLY`` transaction, begun explicitly on
an autocommit connection (so it also works through a transaction-pooling pooler), and
nothing is prepared on the server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from runner.store.json_codec import loads_bytes
from runner.store.pg_settings import CONNECT_TIMEOUT, TCP_SETTINGS
from runner.store.reader import Run

if TYPE_CHECKING:
    import psycopg

#: The URL schemes this path takes (SQLAlchemy's spelling and libpq's).
SCHEMES = ("postgresql+psycopg://", "postgresql://")


# a ``:name`` not preceded by ``:``, a word character or a backslash and not followed by
# ``:`` (``::jsonb`` casts stay), as SQLAlchemy's ``text()`` reads its binds
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")


def pyformat(sql: str) -> str:
    """``sql`` with its ``:name`` placeholders as psycopg's ``%(name)s`` (and each
    literal ``%`` doubled)."""
    return _BIND.sub(r"%(\1)s", sql.replace("%", "%%"))


class PgReader:
    """A ``runner.store.reader.Reader`` on one psycopg connection (see
    :func:`open_postgres`). Raises ``psycopg.Error`` when the database cannot be read."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.load_json: Callable[[Any], Any] = _same  # psycopg decodes jsonb (loads_bytes)
        self._sql: dict[str, str] = {}

    @contextmanager
    def snapshot(self) -> Iterator[Run]:
        """One read-only transaction at ``REPEATABLE READ``: every statement in it reads
        the same snapshot."""
        conn = self.conn
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

        def run(sql: str, params: Mapping[str, Any] | None = None) -> list[Sequence[Any]]:
            text = self._sql.get(sql)
            if text is None:
                text = self._sql[sql] = pyformat(sql)
            rows: list[Any] = conn.execute(text, params or {}, prepare=False).fetchall()
            return rows

        try:
            yield run
        finally:
            if not conn.closed:
                conn.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection; raises nothing."""
        self.conn.close()


def _same(value: Any) -> Any:
    return value


def open_postgres(url: str, revision: str, application_name: str) -> PgReader | None:
    """A :class:`PgReader` on the PostgreSQL database of ``url``, or ``None``.

    ``None`` (nothing left open) unless ``url`` is a plain ``postgresql://`` or
    ``postgresql+psycopg://`` URL without query parameters, psycopg is installed, the
    server answers, and the database is stamped with exactly ``revision`` (its
    ``alembic_version`` table): everything else is ``runner.store.db.make_engine``'s to
    report or handle. ``application_name`` names the connection in ``pg_stat_activity``
    (at most 63 characters are kept). Raises nothing.
    """
    for scheme in SCHEMES:
        if url.startswith(scheme):
            conninfo = "postgresql://" + url[len(scheme) :]
            break
    else:
        return None
    if "?" in conninfo:
        return None
    try:
        import psycopg
        from psycopg.types.json import set_json_loads
    except ImportError:
        return None
    try:
        conn = psycopg.connect(
            conninfo,
            autocommit=True,
            prepare_threshold=None,
            application_name=application_name[:63],
            connect_timeout=CONNECT_TIMEOUT,
            **TCP_SETTINGS,
        )
    except (psycopg.Error, ValueError):
        return None
    try:
        set_json_loads(cast(Callable[[str | bytes], Any], loads_bytes), conn)
        found = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    except psycopg.Error:
        conn.close()
        return None
    if found != [revision]:
        conn.close()
        return None
    return PgReader(conn)
