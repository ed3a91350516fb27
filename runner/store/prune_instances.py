"""The SQL of retention for whole instances: find the deletable ones, delete them with
the rows that belong to them.

One bounded step per call, as the rest of ``runner.store.prune`` (the other kinds):
:func:`candidates` reads at most ``limit`` ids; :func:`delete_instances` deletes a batch
of them with their :data:`CHILDREN` in one short write transaction, re-checking in its own
``WHERE`` that each is still deletable (on PostgreSQL ``FOR UPDATE SKIP LOCKED``). Both
run statements compiled once per engine (``runner.store.prepared.Prepared``): on SQLite
the delete transaction holds the one write lock every worker's claim needs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Engine, Float, Integer, String, bindparam, case, delete, exists, func, select
from sqlalchemy.sql.dml import ReturningDelete

from runner.retention import TERMINAL
from runner.store.db import reading
from runner.store.dialect import Dialect, dialect_of
from runner.store.prepared import Prepared
from runner.store.tables import attempt_logs, attempts, commands, instances

#: The tables whose rows belong to an instance: ``(kind, table)``; each has an
#: ``instance_id`` column with an index leading with it. Rows of a kind ``None`` are
#: deleted but not counted (``logs`` counts attempts: :func:`_flags`).
CHILDREN = (("attempts", attempts), ("commands", commands), (None, attempt_logs))


def _deletable(*, by_id: bool = False) -> tuple[Any, ...]:
    """What makes a terminal instance deletable now: its status (parameter ``status``)
    and age (last changed before parameter ``cutoff``, epoch seconds), unlocked.

    ``by_id``: the rows are already named by id (SQLite only; ignored elsewhere): the
    status is compared as ``status || ''``, which no index serves, so SQLite looks each
    id up by its key. Compared plainly, SQLite's planner (no ``ANALYZE`` statistics)
    walked ``ix_instances_claim`` over every instance of that status for each batch: a
    prune of N instances cost O(N²) (218 s for 100,000)."""
    col = instances.c.status.concat("") if by_id else instances.c.status
    return (
        col == bindparam("status", type_=String()),
        instances.c.updated_at < bindparam("cutoff", type_=Float()),
        instances.c.locked_by.is_(None),
        instances.c.running_attempt.is_(None),
    )


def candidates(
    engine: Engine, flow: str, status: str, cutoff: float, after: int, limit: int
) -> list[tuple[int, int | None, str]]:
    """The next ``limit`` instances of ``flow`` in ``status`` last changed before
    ``cutoff`` (epoch seconds) and unlocked, with ``id > after``, by id: ``(id, event_id,
    version)`` each (one read: an ordered range of ``ix_instances_flow_status``, on
    ``(flow, status, id)``)."""
    assert status in TERMINAL, status
    params = {"flow": flow, "status": status, "cutoff": cutoff, "after": after, "n": limit}
    with reading(engine) as conn:
        return [tuple(r) for r in _statements(engine).candidates.fetch(conn, params)]


def _candidates():
    """:func:`candidates`' read, every value a parameter."""
    return (
        select(instances.c.id, instances.c.event_id, instances.c.version)
        .where(
            instances.c.flow == bindparam("flow", type_=String()),
            instances.c.id > bindparam("after", type_=Integer()),
            *_deletable(),
        )
        .order_by(instances.c.id)
        .limit(bindparam("n", type_=Integer()))
    )


def deletion(d: Dialect) -> ReturningDelete[Any]:
    """The ``DELETE`` of the instances the parameter ``ids`` names (``d.ids_value``)
    that are still deletable (parameters ``status`` and ``cutoff``: :func:`_deletable`),
    returning their ids; on PostgreSQL it skips the rows another transaction holds. Each
    is looked up by its key on both databases."""
    pick = select(instances.c.id).where(
        d.ids_in(instances.c.id), *_deletable(by_id=d.name == "sqlite")
    )
    if d.skip_locked:
        pick = pick.with_for_update(skip_locked=True)
    return (
        delete(instances)
        .where(instances.c.id.in_(pick.scalar_subquery()))
        .returning(instances.c.id)
    )


class _Statements:
    """The statements of :func:`candidates` and :func:`delete_instances`, compiled once
    for one engine (``runner.store.prepared.Prepared``): built per call, SQLAlchemy's
    statement building and cache keys took about half of each delete transaction, all of
    it holding SQLite's write lock (2.9 ms a batch of 16 instances), and in a daemon's
    pruner thread it holds the GIL (``docs/performance.md``, "Prune batches compiled
    once")."""

    def __init__(self, engine: Engine) -> None:
        d = dialect_of(engine)
        self.candidates = Prepared(engine, _candidates())
        self.pick = Prepared(engine, deletion(d))
        self.flags = Prepared(engine, _flags_select(d))
        self.children = [
            (kind, Prepared(engine, delete(table).where(d.ids_in(table.c.instance_id))))
            for kind, table in CHILDREN
        ]


_STATEMENTS: WeakKeyDictionary[Engine, _Statements] = WeakKeyDictionary()


def _statements(engine: Engine) -> _Statements:
    st = _STATEMENTS.get(engine)
    if st is None:
        st = _STATEMENTS[engine] = _Statements(engine)
    return st


def delete_instances(
    engine: Engine, ids: list[int], status: str, cutoff: float, *, dry_run: bool = False
) -> Counter[str]:
    """Delete the instances ``ids`` that are still deletable (see :func:`candidates`)
    with their :data:`CHILDREN`, in ONE transaction; returns the rows counted per kind
    (``instances``, ``attempts``, ``checkpoints``, ``logs``, ``commands``). With
    ``dry_run`` nothing is deleted: the rows ``ids`` name are counted."""
    assert status in TERMINAL, status
    out: Counter[str] = Counter()
    if not ids:
        return out
    d = dialect_of(engine)
    if dry_run:
        with reading(engine) as conn:
            return _count_children(conn, d, ids, out)
    st = _statements(engine)
    with engine.begin() as conn:
        picked = st.pick.fetch(conn, {"ids": d.ids_value(ids), "status": status, "cutoff": cutoff})
        if not picked:
            return out
        gone = [r[0] for r in picked]
        out["instances"] = len(gone)
        value = {"ids": d.ids_value(gone)}
        # the attempts that carried a checkpoint or a stderr tail: one read of the rows
        # about to go (SQLite 3.40's DELETE ... RETURNING gave wrong values for columns
        # outside the index it deleted through)
        cps, logs = st.flags.fetch(conn, value)[0]
        out.update(Counter({"checkpoints": cps, "logs": logs}))
        for kind, stmt in st.children:
            gone_rows = stmt.execute(conn, value)
            if kind is not None:
                out[kind] += gone_rows
    return out


def has_log():
    """An attempt row has a stored log."""
    return exists().where(
        attempt_logs.c.instance_id == attempts.c.instance_id,
        attempt_logs.c.attempt == attempts.c.attempt,
    )


def _flags_select(d: Dialect):
    """``(checkpoints, logs)`` of the instances the parameter ``ids`` names: their
    attempts that carried a checkpoint, and those that carried a kept stderr tail or a
    stored log."""
    logged = case(((attempts.c.error.is_not(None)) | has_log(), 1))
    return select(func.count(attempts.c.checkpoint), func.count(logged)).where(
        d.ids_in(attempts.c.instance_id)
    )


def _flags(conn, d, value: dict[str, Any]) -> Counter[str]:
    """:func:`_flags_select` of the instances ``value`` names, run in ``conn``."""
    cps, logs = conn.execute(_flags_select(d), value).one()
    return Counter({"checkpoints": cps, "logs": logs})


def _count_children(conn, d, ids: list[int], out: Counter[str]):
    """Count ``ids``' instances and their child rows into ``out`` (inside ``conn``'s
    transaction; a dry run); returns ``out``."""
    out["instances"] += len(ids)
    value = {"ids": d.ids_value(ids)}
    out.update(_flags(conn, d, value))
    for kind, table in CHILDREN:
        if kind is None:
            continue
        out[kind] += conn.execute(
            select(func.count()).select_from(table).where(d.ids_in(table.c.instance_id)), value
        ).scalar_one()
    return out
