"""The instances view's reads: a page of rows in a query's order, and the counts.

Both stay cheap on a million instances:

* a page is read in two steps: the ids of the page (``LIMIT``/``OFFSET`` over an index
  that covers the order: the rowid for ``id``, ``ix_instances_flow_status`` for ``flow``,
  ``ix_instances_claim`` for ``status`` (then priority, highest first, and due)), then the
  few rows by id; an ``id`` order continues by key from a row the previous page holds
  (keyset), jumps by key over gap-free ids, and under a broad status/flow filter walks
  the rowid instead of sorting every match;
* counts per status are ``runner.ops.queries.count_by_status`` (the same as the CLI's),
  one ``count(*)`` per status, each a range of ``ix_instances_claim``, run on their own
  slower cadence.

Every function takes the console's read engine (``runner.store.db.read_engine``), blocks
on the database and raises ``sqlalchemy.exc.SQLAlchemyError`` when it cannot read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, String, cast, func, or_, select
from sqlalchemy.sql import ColumnElement

from runner.ops.queries import count_by_status
from runner.store.dialect import dialect_of
from runner.store.tables import instances
from runner.tui.model import Counts, Page, Query, Row

#: Above this many matching rows, an ``id`` order scans the rowid instead of sorting.
ROWID_SCAN_ABOVE = 20_000

#: ``(version, state) -> (max_errors, window seconds)`` of that state's error budget, or None.
PolicyLookup = Callable[[str, str], tuple[int, float] | None]

#: ``(version, state) -> the state's on: events`` when it is external, else None.
WaitsLookup = Callable[[str, str], tuple[str, ...] | None]

_ROW_COLS = (
    instances.c.id,
    instances.c.flow,
    instances.c.version,
    instances.c.state,
    instances.c.status,
    instances.c.locked_by,
    instances.c.locked_until,
    instances.c.attempts,
    instances.c.errors,
    instances.c.restarts,
    instances.c.state_errors,
    instances.c.due_at,
    instances.c.last_error,
    instances.c.label,
    instances.c.waiting_for,
)


def where_clauses(q: Query, *, rowid_scan: bool = False) -> list[ColumnElement[Any]]:
    """The ``WHERE`` clauses of ``q``'s filters (status, flow, text); raises nothing.

    With ``rowid_scan``, the status/flow comparisons hide their index from SQLite's planner
    so an ``id`` order walks the rowid.
    """
    c = instances.c
    # ``col || ''`` hides an index from SQLite's planner, so an id order walks the
    # rowid and stops after the page instead of sorting every matching id.
    status = (c.status + "") if rowid_scan else c.status
    flow = (c.flow + "") if rowid_scan else c.flow
    clauses: list[ColumnElement[Any]] = []
    if q.status:
        clauses.append(status == q.status)
    if q.flow:
        clauses.append(flow == q.flow)
    if q.text:
        like = f"%{q.text.lower()}%"
        ors: list[ColumnElement[bool]] = [
            func.lower(c.flow).like(like),
            func.lower(func.coalesce(c.label, "")).like(like),
            func.lower(c.state).like(like),
            func.lower(c.status).like(like),
            func.lower(func.coalesce(c.last_error, "")).like(like),
            func.lower(cast(c.data, String)).like(like),
        ]
        if q.text.strip().isdigit():
            ors.append(c.id == int(q.text.strip()))
        clauses.append(or_(*ors))
    return clauses


def order_by(q: Query) -> list[ColumnElement[Any]]:
    """The ``ORDER BY`` columns of ``q.sort`` (ties broken by id, unknown keys: ``id``)."""
    c = instances.c
    cols = {
        "id": [c.id],
        "flow": [c.flow, c.status, c.id],
        # the claim's order within a status: ``ix_instances_claim`` read as it is
        "status": [c.status, c.priority, c.due_at, c.id],
        "due": [c.due_at, c.id],
        "state": [c.state, c.id],
        "attempts": [c.attempts, c.id],
        "restarts": [c.restarts, c.id],
        "errors": [c.errors, c.id],
    }.get(q.sort, [c.id])
    # priority is indexed descending: higher first where the rest ascends
    return [col.desc() if q.desc != (col is c.priority) else col.asc() for col in cols]


def read_page(
    reader: Engine,
    q: Query,
    offset: int,
    limit: int,
    *,
    total: int | None = None,
    anchor: Page | None = None,
    policy: PolicyLookup | None = None,
    waits: WaitsLookup | None = None,
) -> Page:
    """Rows ``offset .. offset+limit`` of the instances matching ``q``, in its order.

    Args:
        reader: the read engine.
        q: filters and order.
        offset: absolute position of the first row (negative counts as 0).
        limit: at most this many rows.
        total: the last known count of matching rows: lets an ``id`` order under a
            broad filter walk the rowid rather than sort every match.
        anchor: the page shown before: lets an ``id`` order continue by key from a row
            it holds.
        policy: fills each row's ``max_errors``/``window`` (``None``: left empty).
        waits: fills each row's ``waits_for`` (``None``: left empty).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    t0 = time.perf_counter()
    offset = max(0, offset)
    rowid_scan = (
        dialect_of(reader).rowid_scan
        and q.sort == "id"
        and bool(q.status or q.flow)
        and not q.text
        and (total is None or total > ROWID_SCAN_ABOVE)
    )
    where = where_clauses(q, rowid_scan=rowid_scan)
    skip = offset
    if q.sort == "id" and anchor is not None and anchor.query == q:
        # Keyset: continue from the nearest row we already hold before ``offset``,
        # so scrolling costs the page, not the depth.
        near = anchor.nearest_before(offset)
        if near is not None:
            pos, key = near
            where.append(instances.c.id < key if q.desc else instances.c.id > key)
            skip = offset - pos - 1
    ids_q = select(instances.c.id).where(*where).order_by(*order_by(q)).limit(limit).offset(skip)
    with reader.connect() as conn:
        plain = q.sort == "id" and not (q.status or q.flow or q.text)
        if skip == offset and offset and plain and total:
            jump = dense_jump(conn, q, offset, limit, total)
            if jump is not None:
                ids_q = jump
        ids = list(conn.execute(ids_q).scalars())
        by_id = {}
        if ids:
            for row in conn.execute(select(*_ROW_COLS).where(instances.c.id.in_(ids))):
                by_id[row.id] = row
    rows = []
    for iid in ids:
        r = by_id.get(iid)
        if r is None:
            continue
        pol = policy(r.version, r.state) if policy is not None else None
        rows.append(
            Row(
                id=r.id,
                flow=r.flow,
                version=r.version,
                state=r.state,
                status=r.status,
                locked_by=r.locked_by,
                locked_until=r.locked_until,
                attempts=r.attempts,
                errors=r.errors,
                restarts=r.restarts,
                state_errors=tuple(r.state_errors or ()),
                due_at=r.due_at,
                last_error=r.last_error,
                max_errors=pol[0] if pol else None,
                window=pol[1] if pol else None,
                label=r.label,
                waits_for=waits(r.version, r.state) if waits is not None else None,
                waiting_for=r.waiting_for,
            )
        )
    return Page(q, offset, rows, limit, time.perf_counter() - t0)


def dense_jump(conn: Any, q: Query, offset: int, limit: int, total: int) -> Any:
    """For an unfiltered ``id`` order over gap-free ids (``max - min + 1`` equals the
    known ``total``), a statement positioning by key instead of walking ``offset`` rows;
    ``None`` when the ids have gaps (or there are none).

    Args:
        conn: an open connection of the read engine.
        q: the query (only ``desc`` is used; its filters must be empty).
        offset, limit: the page wanted.
        total: the known number of instances.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    # two statements: SQLite answers a lone min() or max() from the b-tree edge
    lo = conn.execute(select(func.min(instances.c.id))).scalar()
    hi = conn.execute(select(func.max(instances.c.id))).scalar()
    if lo is None or hi - lo + 1 != total:
        return None
    c = instances.c
    if q.desc:
        return select(c.id).where(c.id <= hi - offset).order_by(c.id.desc()).limit(limit)
    return select(c.id).where(c.id >= lo + offset).order_by(c.id).limit(limit)


def read_counts(reader: Engine, q: Query) -> Counts:
    """Counts per status in ``q``'s flow scope and the number of rows ``q`` matches.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    t0 = time.perf_counter()
    by_status = count_by_status(reader, q.flow)
    if q.text:
        stmt = select(func.count()).select_from(instances).where(*where_clauses(q))
        with reader.connect() as conn:
            total = int(conn.execute(stmt).scalar_one())
    elif q.status:
        total = by_status.get(q.status, 0)
    else:
        total = sum(by_status.values())
    return Counts(by_status, total, time.perf_counter() - t0)
