"""Whole batches in one statement: the fenced commit of a batch (PostgreSQL).

Where a statement is a network round trip (``Dialect.batch_statements``), the commit side
of a cycle sends the batch as one statement: its rows travel as JSON documents (one per
kind of row, turned back into rows by ``json_to_recordset``); an ``UPDATE ... FROM``
them fences and writes every outcome and says (``RETURNING``) which instances were still
held, and an ``INSERT ... SELECT`` writes the finished attempts' rows of those only, all
in one statement (data-modifying CTEs). One ``UPDATE`` and one ``INSERT`` per row
(``executemany``, pipelined) cost 3.3 and 2.7 ms per 64 rows here, after a fence read
(``SELECT ... FOR UPDATE``); arrays of each column (``unnest``) instead of JSON cost
psycopg 20 us a row to dump, JSON 4 us (``docs/performance.md``, "One statement for a
PostgreSQL batch").

The rows are built here (:func:`batch_rows`, from the ``rows.Outcome`` list
:func:`runner.store.commit.commit_outcomes` gets), with short keys and nothing the
statement does not read: PostgreSQL lexes every byte of the documents (~3.5-5 us a row
of 250 bytes here). Each row is looked up by primary key, in a transaction that plans
by index only (``runner.store.leases.by_index``).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
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

from runner.store.hot import completing_open
from runner.store.prepared import Prepared
from runner.store.rows import Claim, Outcome, next_claim
from runner.store.tables import attempts, instances

#: the per-row columns of an outcome (short keys: PostgreSQL lexes every byte of the
#: document, ~5 us a row of 250 bytes here), ``{key: (instances column or None, type)}``;
#: ``None``: used by the statement itself (``i`` the id, ``f`` the fence it was claimed
#: under, ``w`` the worker that must still hold it, ``n`` the attempts count)
_OUTCOME: dict[str, tuple[str | None, Any]] = {
    "i": (None, Integer()),
    "f": (None, Integer()),
    "w": (None, String()),
    "n": ("attempts", Integer()),
    "s": ("state", String()),
    "e": ("errors", Integer()),
    "r": ("restarts", Integer()),
    "sr": ("state_restarts", Integer()),
    "le": ("last_error", String()),
    "sc": ("state_changed", Float()),  # NULL keeps the stored value (no move)
    "da": ("data", JSONB()),  # NULL: unchanged, not rewritten
    "se": ("state_errors", JSONB()),  # NULL: unchanged, not rewritten
}
#: more per-row columns of an outcome that releases its instance
_RELEASED = {
    "st": ("status", String()),
    "d": ("due_at", Float()),
    "p": ("priority", Integer()),  # a move's; NULL keeps the row's (or the start's)
    "ro": ("runs_on", String()),  # a move's requirement ('': none); NULL keeps the row's
}
#: the per-row columns of an attempt row (worker and end time are the batch's)
_ATTEMPT = {
    "i": ("instance_id", Integer()),
    "a": ("attempt", Integer()),
    "s": ("state", String()),
    "f": ("fence", Integer()),
    "t": ("started_at", Float()),
    "o": ("outcome", String()),
    "ts": ("to_state", String()),
    "er": ("error", String()),
    "c": ("checkpoint", JSONB()),
    "lb": ("log_bytes", BigInteger()),
}
#: columns whose NULL keeps the stored value
_KEEP_IF_NULL = ("sc", "da", "se")


def _rows(cols: Mapping[str, tuple[str | None, Any]], prefix: str):
    """``json_to_recordset(%(<prefix>rows)s) AS <prefix>(<key> <type>, ...)``: the batch's
    rows as one JSON array of objects (keys beyond ``cols`` are ignored)."""
    names = [column(k, t) for k, (_, t) in cols.items()]
    text = cast(bindparam(prefix + "rows", type_=String()), JSON())
    rows = func.json_to_recordset(text).table_valued(*names).render_derived(with_types=True)
    return rows.alias(prefix.rstrip("_"))


def _fenced_update(
    prefix: str,
    extra: dict[str, tuple[str, Any]],
    scalar: dict[str, Any],
    copies: dict[str, str] | None = None,
):
    """``UPDATE instances ... FROM json_to_recordset(...) RETURNING id`` as a CTE named
    after ``prefix``, each row fenced by ``locked_by`` (param ``w``) and its ``fence``;
    ``extra`` holds the per-row columns beyond :data:`_OUTCOME`, ``scalar`` the values the
    same for the whole batch (``{column: value}``), ``copies`` more columns set from a
    row's key (``{column: key}``)."""
    v = _rows({**_OUTCOME, **extra}, prefix)
    i = instances.c
    values = {
        col: func.coalesce(v.c[k], i[col]) if k in _KEEP_IF_NULL else v.c[k]
        for k, (col, _) in {**_OUTCOME, **extra}.items()
        if col is not None
    }
    if "p" in extra:  # the start's priority wins over a state's
        values["priority"] = func.coalesce(i.start_priority, v.c.p, i.priority)
    if "ro" in extra:
        values["runs_on"] = func.nullif(func.coalesce(v.c.ro, i.runs_on), "")
    values.update(updated_at=bindparam("b_at", type_=Float()), **scalar)
    values.update({col: v.c[k] for col, k in (copies or {}).items()})
    # each row is looked up by primary key from the recordset (a nested loop over an
    # index scan once the table has more than a few hundred rows, a hash join before;
    # ``leases.by_index`` rules out the rest). The owner is checked against the row's
    # ``w`` (the worker), a join condition, through no index (``coalesce``): a condition
    # on ``locked_by`` alone read ``ix_instances_locked_by`` (every row this worker ever
    # held with its dead versions until a vacuum: 5,000 index entries for 64 rows half
    # way through 10,000 jobs) or, estimated to leave one row of the table, joined each
    # to the whole batch (26 ms for 256 rows of 1,000); the ids as an array as well
    # (``id = ANY``) did the same (47 ms for 256 rows)
    return (
        instances.update()
        .where(
            i.id == v.c.i,
            func.coalesce(i.locked_by, "") == v.c.w,
            i.fence == v.c.f,
        )
        .values(values)
        .returning(i.id)
        .cte(prefix.rstrip("_"))
    )


def commit_statement():
    """The whole commit of a batch: the fenced updates of the outcomes that release their
    instance (rows in ``r_rows``; a pool's seat, ``pool``, goes with the lock) and of
    those that keep it (chained, ``k_rows``: the next attempt's number is ``n``), and the
    finished attempts' rows (``a_rows``, as ``hot.close_attempts``: an open row a
    checkpoint wrote is completed, one already closed left as it is) written only for the
    instances the updates held; selects the ids held. Rows as :func:`batch_rows` makes them; scalar
    params: ``w`` (worker, for the attempt rows), ``b_at`` (commit time, epoch s),
    ``b_until`` (the kept leases' end)."""
    released = _fenced_update(
        "r_",
        _RELEASED,
        # a pool's seat goes with the lock (``pools.release`` then only wakes waiters)
        {
            "locked_by": null(),
            "locked_until": null(),
            "running_attempt": null(),
            "pool": null(),
            "pool_slots": null(),
        },
    )
    kept = _fenced_update(
        "k_",
        {},
        {
            "locked_until": bindparam("b_until", type_=Float()),
            "state_attempted": bindparam("b_at", type_=Float()),
        },
        # the chained attempt's number is the new attempts count
        {"running_attempt": "n"},
    )
    held = select(released.c.id).union_all(select(kept.c.id))
    a = _rows(_ATTEMPT, "a_")
    cols = [col for col, _ in _ATTEMPT.values()]
    ins = insert(attempts).from_select(
        [*cols, "worker", "finished_at"],
        select(
            *(a.c[k] for k in _ATTEMPT),
            bindparam("w", type_=String()),
            bindparam("b_at", type_=Float()),
        ).where(a.c.i.in_(held)),
    )
    ins = completing_open(ins)
    return held.add_cte(ins.cte("closed"))


#: a batch's rows as one JSON text (a NaN, which JSON cannot spell, fails the statement
#: as it did through psycopg's ``Jsonb``)
_encode = json.JSONEncoder(separators=(",", ":")).encode


def batch_rows(
    outcomes: list[Outcome], worker_id: str, at: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Claim], list[dict[str, Any]]]:
    """The rows of :func:`commit_statement` for ``outcomes`` of ``worker_id`` ending at
    ``at`` (epoch s):
    ``(released, kept, chained, finished)``: the outcomes that free their instance and
    those that keep it (with the next :class:`Claim` of each kept one, ``chained``), and
    the attempt rows, all with the short keys of :data:`_OUTCOME` and :data:`_ATTEMPT`
    (JSON values as Python objects: they go into the document as they are)."""
    released, kept, chained, finished = [], [], [], []
    for o in outcomes:  # the hot loop: plain item assignments, no helper calls per field
        v, c, av = o.values, o.claim, o.attempt_values
        row = {
            "i": c.id,
            "f": c.fence,
            "w": worker_id,
            "s": v["state"],
            "e": v["errors"],
            "r": v["restarts"],
            "sr": v["state_restarts"],
            "le": v["last_error"],
            "sc": v["state_changed"],
            "da": None if "data" in o.unchanged else v["data"],
            "se": None if "state_errors" in o.unchanged else v["state_errors"],
        }
        if o.chain:
            nxt = next_claim(o, at)
            chained.append(nxt)
            row["n"] = nxt.attempt
            kept.append(row)
        else:
            row.update(st=v["status"], d=v["due_at"], n=c.attempt, p=v.get("priority"))
            if "runs_on" in v and v["runs_on"] != c.runs_on:  # another requirement ('': none)
                row["ro"] = v["runs_on"] or ""
            o.seat_freed = c.pool is not None  # the update gives up its seat
            released.append(row)
        finished.append(
            {
                "i": c.id,
                "a": c.attempt,
                "s": c.state,
                "f": c.fence,
                "t": c.started_at,
                "o": av["outcome"],
                "ts": av["to_state"],
                "er": av["error"],
                "c": av["checkpoint"],
                "lb": av.get("log_bytes"),
            }
        )
    return released, kept, chained, finished


class Batch:
    """The batch statements of one engine (compiled once, see ``prepared.Prepared``)."""

    def __init__(self, engine: Engine) -> None:
        #: the whole fenced commit of a batch (:func:`commit_statement`)
        self.commit_all = Prepared(engine, commit_statement())

    def commit(
        self,
        conn: Connection,
        worker_id: str,
        at: float,
        until: float,
        batches: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]],
    ) -> set[int]:
        """Write a batch of outcomes in one statement, each only where ``worker_id`` still
        holds its instance under the claimed fence, with its attempt's row.

        ``batches``: ``(released, kept, finished)`` of :func:`batch_rows`: outcomes that
        free their instance, outcomes that keep it (chained, lease until ``until``), and
        the attempt rows; ``at``: the commit time (epoch s). Returns the ids written; the
        others were taken away (no attempt row is written for them).
        """
        released, kept, finished = batches
        params: dict[str, Any] = {
            "w": worker_id,
            "b_at": at,
            "b_until": until,
            "r_rows": _encode(released),
            "k_rows": _encode(kept),
            "a_rows": _encode(finished),
        }
        return {r[0] for r in self.commit_all.fetch(conn, params)}


_batches: weakref.WeakKeyDictionary[Engine, Batch] = weakref.WeakKeyDictionary()


def batch_for(conn: Connection) -> Batch:
    """The :class:`Batch` statements of ``conn``'s engine (compiled on first use)."""
    engine = conn.engine
    found = _batches.get(engine)
    if found is None:
        found = _batches[engine] = Batch(engine)
    return found
