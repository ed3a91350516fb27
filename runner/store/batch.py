"""Whole batches in one statement: the fenced commit of a batch (PostgreSQL).

Where a statement is a network round trip (``Dialect.batch_statements``), the commit side
of a cycle sends the batch as one statement: its rows travel as JSON documents (one per
kind of row, turned back into rows by ``json_to_recordset``); an ``UPDATE ... FROM``
them fences and writes every outcome and says (``RETURNING``) which instances were still
held, and an ``INSERT ... SELECT`` writes the finished attempts' rows of those only, all
in one statement (data-modifying CTEs). Before, one ``UPDATE`` and one ``INSERT`` per row
(``executemany``, pipelined) cost 3.3 and 2.7 ms per 64 rows here, after a fence read
(``SELECT ... FOR UPDATE``); arrays of each column (``unnest``) instead of JSON cost
psycopg 20 us a row to dump, JSON 4 us. See ``docs/performance.md``.

The statement takes the row dicts :func:`runner.store.commit.commit_outcomes` builds (the
``rows.Hot.commit_instances`` / ``commit_chained`` parameters, JSON values not adapted)
and :func:`runner.store.rows.attempt_row`'s, so both dialects share the code that makes
them.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Float,
    Integer,
    String,
    bindparam,
    cast,
    column,
    func,
    null,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB, insert

from runner.store.db import Prepared
from runner.store.rows import completing_open
from runner.store.tables import attempts, instances

#: the outcome columns of an instance, with their SQL types
_OUTCOME = {
    "state": String(),
    "errors": Integer(),
    "restarts": Integer(),
    "state_restarts": Integer(),
    "last_error": String(),
    "state_changed": Float(),
    "data": JSONB(),
    "state_errors": JSONB(),
    "b_id": Integer(),
    "b_fence": Integer(),
    "b_attempts": Integer(),
}
#: more per-row columns of an outcome that releases its instance / keeps it (chained):
#: ``{key: (instances column, type)}``
_RELEASED = {"status": ("status", String()), "due_at": ("due_at", Float())}
_CHAINED = {"b_next": ("running_attempt", Integer())}
#: the columns of an attempt row (``rows.attempt_row``'s keys)
_ATTEMPT = {
    "i": Integer(),
    "a": Integer(),
    "s": String(),
    "w": String(),
    "f": Integer(),
    "t": Float(),
    "at": Float(),
    "outcome": String(),
    "to_state": String(),
    "error": String(),
    "checkpoint": JSONB(),
}


def _rows(cols: dict[str, Any], prefix: str):
    """``json_to_recordset(%(<prefix>rows)s) AS <prefix>(<key> <type>, ...)``: the batch's
    rows as one JSON array of objects (keys beyond ``cols`` are ignored)."""
    names = [column(k, t) for k, t in cols.items()]
    text = cast(bindparam(prefix + "rows", type_=String()), JSON())
    rows = func.json_to_recordset(text).table_valued(*names).render_derived(with_types=True)
    return rows.alias(prefix.rstrip("_"))


def _fenced_update(prefix: str, extra: dict[str, tuple[str, Any]], scalar: dict[str, Any]):
    """``UPDATE instances ... FROM json_to_recordset(...) RETURNING id`` as a CTE named
    after ``prefix``, each row fenced by ``locked_by`` (param ``w``) and its ``fence``;
    ``extra`` holds the per-row columns beyond :data:`_OUTCOME` (``{key: (column,
    type)}``), ``scalar`` the values the same for the whole batch."""
    v = _rows({**_OUTCOME, **{k: t for k, (_, t) in extra.items()}}, prefix)
    i = instances.c
    values = {
        "state": v.c.state,
        "errors": v.c.errors,
        "restarts": v.c.restarts,
        "state_restarts": v.c.state_restarts,
        "last_error": v.c.last_error,
        # NULL keeps the stored value: unchanged JSON is not rewritten
        "state_changed": func.coalesce(v.c.state_changed, i.state_changed),
        "data": func.coalesce(v.c.data, i.data),
        "state_errors": func.coalesce(v.c.state_errors, i.state_errors),
        "attempts": v.c.b_attempts,
        "updated_at": bindparam("b_at", type_=Float()),
        **{col: v.c[k] for k, (col, _) in extra.items()},
        **scalar,
    }
    return (
        instances.update()
        .where(i.id == v.c.b_id, i.locked_by == bindparam("w"), i.fence == v.c.b_fence)
        .values(values)
        .returning(i.id)
        .cte(prefix.rstrip("_"))
    )


def commit_statement():
    """The whole commit of a batch: the fenced updates of the outcomes that release their
    instance (rows in ``r_rows``, as ``rows.Hot.commit_instances``) and of those that keep
    it (``k_rows``, as ``rows.Hot.commit_chained``), and the finished attempts' rows
    (``a_rows``, as ``rows.close_attempts``: an open row a checkpoint wrote is completed,
    one already closed left as it is) written only for the instances the updates held;
    selects the ids held. Scalar params: ``w`` (worker), ``b_at`` (commit time, epoch s),
    ``b_until`` (the kept leases' end)."""
    released = _fenced_update(
        "r_",
        _RELEASED,
        {"locked_by": null(), "locked_until": null(), "running_attempt": null()},
    )
    kept = _fenced_update(
        "k_",
        _CHAINED,
        {
            "locked_until": bindparam("b_until", type_=Float()),
            "state_attempted": bindparam("b_at", type_=Float()),
        },
    )
    held = select(released.c.id).union_all(select(kept.c.id))
    a = _rows(_ATTEMPT, "a_")
    ins = insert(attempts).from_select(
        [
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
        ],
        select(*(a.c[k] for k in _ATTEMPT)).where(a.c.i.in_(held)),
    )
    ins = completing_open(ins)
    return held.add_cte(ins.cte("closed"))


#: a batch's rows as one JSON text (a NaN, which JSON cannot spell, fails the statement
#: as it did through psycopg's ``Jsonb``)
_encode = json.JSONEncoder(separators=(",", ":")).encode


class Batch:
    """The batch statements of one engine (compiled once, see ``db.Prepared``)."""

    def __init__(self, engine: Engine) -> None:
        #: the whole fenced commit of a batch (:func:`commit_statement`)
        self.commit_all = Prepared(engine, commit_statement())

    def commit(
        self,
        conn: Connection,
        worker_id: str,
        at: float,
        until: float,
        batches: tuple[list[dict], list[dict], list[dict]],
    ) -> set[int]:
        """Write a batch of outcomes in one statement, each only where ``worker_id`` still
        holds its instance under the claimed fence, with its attempt's row.

        ``batches``: the row dicts ``commit_outcomes`` builds, ``(released, kept,
        finished)``: outcomes that free their instance, outcomes that keep it (chained,
        lease until ``until``), and the attempt rows (``rows.attempt_row``); ``at``: the
        commit time (epoch s). Returns the ids written; the others were taken away (no
        attempt row is written for them).
        """
        params: dict[str, Any] = {"w": worker_id, "b_at": at, "b_until": until}
        for prefix, rows in zip(("r_", "k_", "a_"), batches, strict=True):
            params[prefix + "rows"] = _encode(rows)
        return {r[0] for r in self.commit_all.fetch(conn, params)}


_batches: weakref.WeakKeyDictionary[Engine, Batch] = weakref.WeakKeyDictionary()


def batch_for(conn: Connection) -> Batch:
    """The :class:`Batch` statements of ``conn``'s engine (compiled on first use)."""
    engine = conn.engine
    found = _batches.get(engine)
    if found is None:
        found = _batches[engine] = Batch(engine)
    return found
