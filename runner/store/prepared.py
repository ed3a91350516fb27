"""Statements prepared for one engine: compiled once, run through the driver.

One responsibility: :class:`Prepared`, the worker's hot statements (``hot.Hot``,
``batch``, ``pool_statements``) without SQLAlchemy's per-call statement building.
"""

from __future__ import annotations

import operator
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from runner.store.dialect import dialect_of


class Prepared:
    """A Core statement compiled once for one engine's dialect, run through the driver.

    The worker's hot statements run thousands of times a second; compiling them once and
    handing plain tuples to the driver removes SQLAlchemy's statement building, cache-key
    generation and per-row parameter processing. Every parameter must be an explicit
    ``bindparam`` supplied by name (those the compiler adds itself, such as SQLite's
    ``OFFSET 0``, keep their compiled value); JSON values must already be adapted with
    ``Dialect.json_adapter``, and JSON results are raw driver values (see
    ``Dialect.json_loader`` in ``runner.store.dialect``).

    On SQLite the statement goes straight to the connection's ``sqlite3`` cursor, inside
    the transaction the SQLAlchemy ``Connection`` began (a driver error is raised as
    SQLAlchemy's ``DBAPIError``, as through ``exec_driver_sql``); there the worker's
    cycle runs on the event loop, where SQLAlchemy's per-statement bookkeeping cost
    about a tenth of the loop's time. PostgreSQL keeps ``exec_driver_sql``, which also
    notices a lost connection and invalidates it.
    """

    def __init__(self, engine: Engine, stmt) -> None:
        compiled = stmt.compile(dialect=engine.dialect)
        self.sql = str(compiled)
        self.raw = dialect_of(engine).in_process
        self.order = compiled.positiontup if compiled.positional else None
        # a C-level getter building each row's tuple in the driver's order
        self._tuple = None
        if self.order:
            pick = operator.itemgetter(*self.order)
            self._tuple = pick if len(self.order) > 1 else (lambda r: (pick(r),))
        # values written into the statement itself (``.values(status="runnable")``, SQLite's
        # ``OFFSET 0``); every other parameter is required in each call
        self.defaults = {
            name: compiled.params[name]
            for name, bind in compiled.binds.items()
            if not bind.required and name in compiled.params
        }

    def _params(self, row: dict[str, Any]):
        if self.order is None:
            return {**self.defaults, **row} if self.defaults else row
        if self.defaults:
            row = {**self.defaults, **row}
        return tuple(row[k] for k in self.order)

    def _run(self, conn, params, many: bool):
        if not self.raw:
            return conn.exec_driver_sql(self.sql, params)
        cur = conn.connection.dbapi_connection.cursor()
        try:
            if many:
                cur.executemany(self.sql, params)
            else:
                cur.execute(self.sql, params)
        except conn.dialect.loaded_dbapi.Error as exc:
            raise DBAPIError.instance(
                self.sql, params, exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect
            ) from exc
        return cur

    def fetch(self, conn, params: dict[str, Any]) -> list[Any]:
        """Run the statement once with ``params`` (by name); returns its rows (tuples)."""
        out = self._run(conn, self._params(params), False)
        return out.fetchall() if self.raw else out.all()

    def execute(self, conn, params: dict[str, Any]) -> int:
        """Run the statement once with ``params`` (by name); returns the number of rows
        it changed."""
        return self._run(conn, self._params(params), False).rowcount

    def executemany(self, conn, rows: list[dict[str, Any]]) -> int:
        """Run the statement once per row dict, in one driver call; returns the number of
        rows it changed in all (``-1`` where the driver does not say)."""
        if not rows:
            return 0
        if self._tuple is not None and not self.defaults:
            params = list(map(self._tuple, rows))
        else:
            params = [self._params(r) for r in rows]
        return self._run(conn, params, True).rowcount
