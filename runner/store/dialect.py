"""Every SQL dialect difference flowrun knows, behind one object per database kind.

The code above the store never asks which database it talks to; it asks the engine's
:class:`Dialect` (``dialect_of(engine)``) for a fact (``skip_locked``, ``serial_writes``,
``in_process``, ``rowid_scan``, ``batch_migrations``, ``advisory_locks``,
``batch_statements``, ``notify``, ``server_clock``) or a function (``insert``,
``ids_in``/``ids_value``, ``json_loader``/``json_adapter``). The idea
is huey's ``BaseStorage``: one interface, one implementation per backend, chosen once.

There are two: :data:`SQLITE` (a file with WAL, one writer at a time under ``BEGIN
IMMEDIATE``, see ``runner.store.db``) and :data:`POSTGRESQL` (``psycopg`` 3, row locks
with ``FOR UPDATE SKIP LOCKED``). Both are module-level singletons: ``dialect_of`` is a
dict lookup, and the worker's hot statements (``runner.store.hot.Hot``) keep the one
they resolved, so the claim and commit path pays nothing per call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Integer,
    String,
    any_,
    bindparam,
    cast,
    exists,
    func,
    literal_column,
    or_,
    select,
)

from runner.errors import ConfigError
from runner.store.json_codec import sqlite_json_adapter, sqlite_json_loader

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.engine import Dialect as SADialect
    from sqlalchemy.types import TypeEngine


@dataclass(frozen=True)
class Dialect:
    """What differs between the databases flowrun runs on.

    Attributes:
        name: SQLAlchemy's dialect name (``sqlite`` or ``postgresql``).
        skip_locked: the claim may use ``FOR UPDATE SKIP LOCKED`` (row locks).
        serial_writes: one write transaction holds the whole database until it ends
            (SQLite's ``BEGIN IMMEDIATE``): nothing another process does can interleave,
            so a batch may write first and check the row counts after
            (``runner.store.commit.commit_outcomes``).
        in_process: the database is a library in this process (SQLite): a statement is
            a function call, not a network round trip. ``runner.store.prepared.Prepared`` then
            runs on the driver's cursor directly, and sibling engines on the same file
            (``no_wait_engine``, ``read_engine``) make sense; PostgreSQL keeps
            SQLAlchemy's ``exec_driver_sql``, which notices a lost connection.
        rowid_scan: ``col || ''`` hides an index from the planner, so an ``id`` order
            walks the rowid (SQLite; ``runner.tui.paging``).
        batch_migrations: alembic must rebuild tables to alter them (``render_as_batch``).
        advisory_locks: a transaction may take ``pg_advisory_xact_lock`` (PostgreSQL;
            on SQLite ``BEGIN IMMEDIATE`` already excludes every other writer).
        batch_statements: the commit side sends a whole batch as one statement
            (``runner.store.batch``; PostgreSQL, where each statement is a round trip);
            SQLite runs one statement per row (``executemany``), a function call each.
        notify: daemons wake each other through ``LISTEN``/``NOTIFY``
            (``runner.store.notify``; PostgreSQL); on SQLite they poll the shared file.
        server_clock: an SQL expression of the server's clock in epoch seconds, read to
            judge leases and due times by the database's time (``runner.store.clock``;
            PostgreSQL: many hosts share the rows); ``None`` on SQLite (one host: the
            local clock).
        insert: the dialect's ``insert`` construct (with ``on_conflict_do_nothing`` /
            ``on_conflict_do_update``).
        ids_value: a list of ids → the parameter value of :meth:`ids_in`.
        json_loader: builds the function turning a raw JSON column value from the driver
            into Python (for ``Prepared`` results).
        json_adapter: builds the function turning a Python value into a JSON parameter
            for ``Prepared``.
    """

    name: str
    skip_locked: bool
    serial_writes: bool
    in_process: bool
    rowid_scan: bool
    batch_migrations: bool
    advisory_locks: bool
    batch_statements: bool
    notify: bool
    server_clock: str | None
    insert: Callable[..., Any]
    ids_value: Callable[[list[int]], Any]
    json_loader: Callable[[], Callable[[Any], Any]]
    json_adapter: Callable[[], Callable[[Any], Any]]

    def ids_in(self, column: ColumnElement[int], name: str = "ids") -> ColumnElement[bool]:
        """A ``column IN <list of ids>`` clause bound to ONE parameter ``name``.

        Unlike ``column.in_([...])`` (one placeholder per id, so a new SQL string for
        every list length) it compiles once, for ``runner.store.prepared.Prepared``: ``=
        ANY(%(ids)s)`` with an integer array on PostgreSQL, ``IN (SELECT value FROM
        json_each(?))`` on SQLite. Pass the value through :attr:`ids_value`.
        """
        if self.name == "postgresql":
            from sqlalchemy.dialects.postgresql import ARRAY

            return column == any_(bindparam(name, type_=ARRAY(Integer)))
        each = func.json_each(bindparam(name)).table_valued("value")
        return column.in_(select(each.c.value).scalar_subquery())

    def covered(self, required: ColumnElement[Any], name: str = "labels") -> ColumnElement[bool]:
        """``required`` (JSON text of an object of strings, ``runner.labels.canonical``;
        NULL: none) is a subset of the labels bound to parameter ``name`` (the same
        text): every pair of ``required`` is in them, values compared as text.

        PostgreSQL: ``CAST(required AS jsonb) <@ CAST(:labels AS jsonb)``. SQLite: no
        pair of ``required`` (``json_each``) differs from the label of its name
        (``json_extract`` of ``$."name"``: label names hold no ``"``,
        ``runner.labels.KEY_RE``). Either is evaluated only for rows with a requirement
        (``required IS NULL OR ...``), so work without one pays nothing more.
        """
        labels = bindparam(name, type_=String())
        covers: ColumnElement[bool]
        if self.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            covers = cast(required, JSONB).op("<@")(cast(labels, JSONB))
        else:
            pair = func.json_each(required).table_valued("key", "value").alias("req")
            path = (
                literal_column("'$.\"'", String()) + pair.c.key + literal_column("'\"'", String())
            )
            label = func.json_extract(labels, path)
            one = literal_column("1", Integer())
            covers = ~exists(select(one).select_from(pair).where(pair.c.value.is_not(label)))
        return or_(required.is_(None), covers)


def _sqlite_insert(table: Any) -> Any:
    from sqlalchemy.dialects.sqlite import insert

    return insert(table)


def _pg_insert(table: Any) -> Any:
    from sqlalchemy.dialects.postgresql import insert

    return insert(table)


def _pg_json_loader() -> Callable[[Any], Any]:
    """psycopg decodes JSONB itself."""
    return lambda v: v


def _pg_json_adapter() -> Callable[[Any], Any]:
    from psycopg.types.json import Jsonb

    return lambda v: None if v is None else Jsonb(v)


SQLITE = Dialect(
    name="sqlite",
    skip_locked=False,
    serial_writes=True,
    in_process=True,
    rowid_scan=True,
    batch_migrations=True,
    advisory_locks=False,
    batch_statements=False,
    notify=False,
    server_clock=None,
    insert=_sqlite_insert,
    ids_value=lambda ids: json.dumps(list(ids)),
    json_loader=sqlite_json_loader,
    json_adapter=sqlite_json_adapter,
)

POSTGRESQL = Dialect(
    name="postgresql",
    skip_locked=True,
    serial_writes=False,
    in_process=False,
    rowid_scan=False,
    batch_migrations=False,
    advisory_locks=True,
    batch_statements=True,
    notify=True,
    # the time the statement reads it (``now()`` is the transaction's start)
    server_clock="extract(epoch FROM clock_timestamp())",
    insert=_pg_insert,
    ids_value=list,
    json_loader=_pg_json_loader,
    json_adapter=_pg_json_adapter,
)

_BY_NAME = {d.name: d for d in (SQLITE, POSTGRESQL)}


def json_column_type(dialect: SADialect) -> TypeEngine[Any]:
    """The column type of JSON values on ``dialect`` (SQLAlchemy's ``Dialect``, as a
    ``TypeDecorator.load_dialect_impl`` gets it): ``JSONB`` on PostgreSQL, imported only
    then (``sqlalchemy.dialects.postgresql`` loads every PostgreSQL driver's dialect),
    ``JSON`` on any other database."""
    if dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import JSONB

        return JSONB()
    return JSON()


def dialect_of(bind: Engine | Connection) -> Dialect:
    """The :class:`Dialect` of an ``Engine`` or ``Connection`` (a dict lookup; resolve it
    once where a path runs often).

    Raises:
        ConfigError: a database flowrun does not support (neither SQLite nor PostgreSQL).
    """
    name = bind.dialect.name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"unsupported database {name!r}: flowrun runs on SQLite or PostgreSQL"
        ) from None
