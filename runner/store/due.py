"""When work is due, read without the write lock: is anything due for this worker now
(:func:`has_due`, an idle worker's look), how much work is left (:func:`busy_count`,
``--exit-when-idle``) and when the next piece of work appears without anyone saying so
(:func:`next_times`: the next due time and the next lease expiry, so a worker woken by
notifications sleeps until then instead of polling). Index reads only.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    Select,
    String,
    and_,
    bindparam,
    column,
    func,
    literal_column,
    or_,
    select,
    true,
    union_all,
    values,
)

from runner.store.clock import db_now
from runner.store.dialect import Dialect, dialect_of
from runner.store.rows import CLAIMABLE, PRIORITIES, due_clause
from runner.store.tables import instances


@cache
def _has_due(dialect: Dialect) -> Select[Any]:
    """:func:`has_due`'s statement for ``dialect``, built once (an idle worker asks every
    second)."""
    routed = dialect.covered(instances.c.runs_on)
    return select(instances.c.id).where(due_clause(bindparam("at")), routed).limit(1)


def has_due(conn: Connection, at: float, labels: str | None = None) -> bool:
    """Cheap read (no write lock): is any instance due and unlocked at ``at`` that a
    worker with ``labels`` (``runner.labels.canonical``; ``None``: none) may claim?"""
    params = {"at": at, "labels": labels or "{}"}
    return conn.execute(_has_due(dialect_of(conn)), params).first() is not None


def busy_count(conn: Connection, at: float | None = None) -> int:
    """Instances with work left: runnable/sleeping with a due time, or an attempt running
    under a lease still valid, or one whose lease expired on a runnable/sleeping instance
    (its worker died: ``recover_lost`` restarts it, so ``--exit-when-idle`` must not exit
    between the expiry and that recovery). An orphan of a dead worker on a paused
    instance is not work: it is closed when the instance is resumed or killed."""
    at = db_now(conn) if at is None else at
    i = instances.c
    q = select(func.count()).where(
        or_(
            and_(
                i.running_attempt.is_not(None),
                or_(i.locked_until > at, i.status.in_(CLAIMABLE)),
            ),
            and_(
                instances.c.status.in_(CLAIMABLE),
                # waiting for a pool's slot (``store.pools``) is work left too
                or_(instances.c.due_at.is_not(None), instances.c.waiting_for.is_not(None)),
            ),
        )
    )
    return conn.execute(q).scalar_one()


def next_times(conn: Connection, at: float) -> tuple[float | None, float | None]:
    """When the next piece of work appears without anyone saying so (epoch seconds, UTC).

    Returns ``(next_due, next_expiry)``: the earliest ``due_at`` after ``at`` of an
    unlocked claimable instance (a backoff or try interval coming due), and the earliest
    lease expiry of an attempt running anywhere (when ``recover_lost`` may find it lost);
    ``None`` where there is none. Index reads only: the first entry after ``at`` of each
    status and priority in ``ix_instances_claim`` (status, priority DESC, due_at), and
    the locked rows; a worker woken through ``LISTEN/NOTIFY`` sleeps until the earlier
    of them instead of polling.
    """
    due, expiry = conn.execute(_next_times(dialect_of(conn).skip_locked), {"at": at}).one()
    return due, expiry


@cache
def _next_times(lateral: bool) -> Select[Any]:
    """:func:`next_times`' statement, built once (an idle worker asks at each look:
    building the union of one ``SELECT`` a status and priority was most of an idle
    daemon's Python time): both times in one round trip, as two scalar subqueries.

    ``lateral`` (PostgreSQL): one ``LATERAL`` subquery over the 18 ``(status,
    priority)`` pairs (a ``VALUES`` list, as the claim reads them: ``hot.claim_statement``),
    each the first entry after ``at`` of one range of ``ix_instances_claim``. The union
    of 18 ``SELECT min(...)`` it replaces took 5.4 ms to plan for 0.7 ms of execution
    (``EXPLAIN ANALYZE`` during ``bench/pools.py``'s pool-bound run, where every cycle
    that claims nothing plans), before psycopg prepares it on a connection's sixth run.
    The time bound is a scalar subquery, so the planner does not see its value: seeing
    it, a custom plan looked up each range's actual end in the index
    (``get_actual_variable_range``) through the dead entries of a busy table. SQLite plans
    the union in microseconds."""
    i = instances.c
    at: Any = bindparam("at", type_=Float())
    expiry = (
        select(func.min(i.locked_until))
        .where(i.locked_by.is_not(None), i.running_attempt.is_not(None))
        .scalar_subquery()
    )
    if lateral:
        at = select(at).scalar_subquery()
        keys = values(column("s", String()), column("p", Integer()), name="k", literal_binds=True)
        keys = keys.data([(status, p) for status in CLAIMABLE for p in PRIORITIES])
        first = (
            select(i.due_at)
            .where(
                i.status == keys.c.s,
                i.priority == keys.c.p,
                i.due_at > at,
                i.locked_by.is_(None),
            )
            .order_by(i.due_at)
            .limit(1)
            .lateral("first")
        )
        due = select(func.min(first.c.due_at)).select_from(keys).join(first, true())
        return select(due.scalar_subquery(), expiry)
    firsts = [
        select(func.min(i.due_at).label("m")).where(
            i.status == literal_column(f"'{status}'"),
            i.priority == literal_column(str(p)),
            i.due_at > at,
            i.locked_by.is_(None),
        )
        for status in CLAIMABLE
        for p in PRIORITIES
    ]
    each = union_all(*firsts).subquery()
    return select(select(func.min(each.c.m)).scalar_subquery(), expiry)
