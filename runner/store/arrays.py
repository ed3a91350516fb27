"""Whole batches in one statement: the fenced commit as arrays (PostgreSQL).

Where a statement is a network round trip (``Dialect.array_batches``), the commit side of
a cycle sends each column of a batch as one array and lets ``unnest`` turn them back into
rows: one ``UPDATE ... FROM unnest(...)`` fences and writes every outcome of the batch and
says (``RETURNING``) which instances were still held; one ``INSERT ... SELECT FROM
unnest(...)`` writes every finished attempt's row. An ``executemany`` of the same
statements (one statement per row, pipelined) cost 3.3 and 2.7 ms per 64 rows here, and
needed a fence read (``SELECT ... FOR UPDATE``) first; see ``docs/performance.md``.

The statements take the row dicts :func:`runner.store.commit.commit_outcomes` builds (the
``rows.Hot.commit_instances`` / ``commit_chained`` parameters) and
:func:`runner.store.rows.attempt_row`'s, so both dialects share the code that makes them.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Integer,
    String,
    bindparam,
    column,
    func,
    null,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from runner.store.db import Prepared
from runner.store.tables import attempts, instances

#: the outcome columns of an instance, with their SQL types (arrays of them are sent)
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


def _unnest(cols: dict[str, Any], prefix: str):
    """``unnest(%(<prefix><key>)s::T[], ...) AS <prefix>(<key>, ...)``: one array parameter
    a column, named ``prefix + key`` (a bind parameter may not share a column's name)."""
    arrays = [bindparam(prefix + k, type_=ARRAY(t)) for k, t in cols.items()]
    names = [column(k, t) for k, t in cols.items()]
    rows = func.unnest(*arrays).table_valued(*names).render_derived(with_types=False)
    return rows.alias(prefix.rstrip("_"))


def _fenced_update(prefix: str, extra: dict[str, tuple[str, Any]], scalar: dict[str, Any]):
    """``UPDATE instances ... FROM unnest(...) RETURNING id`` as a CTE named ``prefix``,
    each row fenced by ``locked_by`` (param ``w``) and its ``fence``; ``extra`` holds the
    per-row columns beyond :data:`_OUTCOME` (``{key: (column, type)}``), ``scalar`` the
    values the same for the whole batch."""
    v = _unnest({**_OUTCOME, **{k: t for k, (_, t) in extra.items()}}, prefix)
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
    instance (``r_*`` arrays, as ``rows.Hot.commit_instances``) and of those that keep it
    (``k_*``, as ``rows.Hot.commit_chained``), and the finished attempts' rows (``a_*``,
    as ``rows.close_attempts``: an open row a checkpoint wrote is completed, one already
    closed left as it is) written only for the instances the updates held; selects the
    ids held. Scalar params: ``w`` (worker), ``b_at`` (commit time), ``b_until`` (lease)."""
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
    a = _unnest(_ATTEMPT, "a_")
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
    x = ins.excluded
    ins = ins.on_conflict_do_update(
        index_elements=[attempts.c.instance_id, attempts.c.attempt],
        set_={
            "finished_at": x.finished_at,
            "outcome": x.outcome,
            "to_state": x.to_state,
            "error": x.error,
            "checkpoint": func.coalesce(x.checkpoint, attempts.c.checkpoint),
        },
        where=attempts.c.outcome.is_(None),
    )
    return held.add_cte(ins.cte("closed"))


#: the array parameters of :func:`commit_statement`: prefix, row keys
_ARRAYS = (("r_", [*_OUTCOME, *_RELEASED]), ("k_", [*_OUTCOME, *_CHAINED]), ("a_", [*_ATTEMPT]))


class Arrays:
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
        for (prefix, keys), rows in zip(_ARRAYS, batches, strict=True):
            for k in keys:
                params[prefix + k] = [r[k] for r in rows]
        return {r[0] for r in self.commit_all.fetch(conn, params)}


_arrays: weakref.WeakKeyDictionary[Engine, Arrays] = weakref.WeakKeyDictionary()


def arrays_for(conn: Connection) -> Arrays:
    """The :class:`Arrays` statements of ``conn``'s engine (compiled on first use)."""
    engine = conn.engine
    found = _arrays.get(engine)
    if found is None:
        found = _arrays[engine] = Arrays(engine)
    return found
