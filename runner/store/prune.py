"""The SQL of retention: read the candidates, delete them in short transactions.

Each function does one bounded step (a read of at most ``limit`` rows, or one short
write transaction) so the caller (``runner.ops.prune``) can pace them; the rules
deciding what goes are ``runner.retention``. Every delete re-checks its conditions in
its own ``WHERE`` (a row that changed since it was read stays), and on PostgreSQL takes
its rows ``FOR UPDATE SKIP LOCKED``: a row another transaction holds is skipped, and two
pruners never delete (or count) a row twice. With ``dry_run`` the same steps count
instead of deleting, in read transactions.

Whole instances (with the rows that belong to them) are ``runner.store.prune_instances``'
job; a live instance's attempts cut by the history rule take their logs with them. Past the
store's size bound (``--log-store-max``), :func:`evict_logs` deletes the logs of the
oldest terminal instances first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, Engine, bindparam, case, delete, exists, func, select, update

from runner.retention import TERMINAL
from runner.store.db import reading
from runner.store.dialect import dialect_of
from runner.store.prune_instances import has_log
from runner.store.tables import (
    attempt_logs,
    attempts,
    events,
    flow_versions,
    instances,
    workers,
)


def attempts_after(engine: Engine, after: int, limit: int) -> list[tuple[Any, ...]]:
    """The next ``limit`` attempt rows with ``id > after`` by id, each with its instance:
    ``(id, instance_id, attempt, finished_at, has_checkpoint, has_error_or_log, flow,
    status, instance attempts)`` (one read; the history cut walks them oldest first)."""
    stmt = (
        select(
            attempts.c.id,
            attempts.c.instance_id,
            attempts.c.attempt,
            attempts.c.finished_at,
            attempts.c.checkpoint.is_not(None),
            attempts.c.error.is_not(None) | has_log(),
            instances.c.flow,
            instances.c.status,
            instances.c.attempts,
        )
        .join(instances, instances.c.id == attempts.c.instance_id)
        .where(attempts.c.id > after)
        .order_by(attempts.c.id)
        .limit(limit)
    )
    with reading(engine) as conn:
        return [tuple(r) for r in conn.execute(stmt)]


def cut_history(
    engine: Engine, rows: list[tuple[Any, ...]], *, dry_run: bool = False
) -> Counter[str]:
    """Delete the attempt rows ``rows`` (as :func:`attempts_after` gave them, chosen by
    ``runner.retention.cut_attempt``) of live instances, and set each instance's
    ``history_from`` to the latest ``finished_at`` cut, in ONE transaction; returns the
    rows per kind (``attempts``, ``checkpoints``, ``logs``)."""
    out: Counter[str] = Counter()
    if not rows:
        return out
    out["attempts"] = len(rows)
    out["checkpoints"] = sum(1 for r in rows if r[4])
    out["logs"] = sum(1 for r in rows if r[5])
    if dry_run:
        return out
    d = dialect_of(engine)
    upto: dict[int, float] = {}
    for r in rows:
        upto[r[1]] = max(upto.get(r[1], 0.0), r[3])
    with engine.begin() as conn:
        done = conn.execute(
            delete(attempts).where(d.ids_in(attempts.c.id), attempts.c.outcome.is_not(None)),
            {"ids": d.ids_value([r[0] for r in rows])},
        ).rowcount
        conn.execute(
            delete(attempt_logs).where(
                attempt_logs.c.instance_id == bindparam("iid"),
                attempt_logs.c.attempt == bindparam("no"),
            ),
            [{"iid": r[1], "no": r[2]} for r in rows],
        )
        for iid, at in sorted(upto.items()):
            hist = instances.c.history_from
            conn.execute(
                update(instances)
                .where(instances.c.id == iid)
                .values(history_from=case((hist.is_(None) | (hist < at), at), else_=hist))
            )
    if done != len(rows):  # a row gone meanwhile (another pruner): count what went
        out = Counter({"attempts": done})
    return out


def log_bytes(engine: Engine) -> int:
    """Bytes of every stored attempt log (what ``--log-store-max`` bounds)."""
    size = func.coalesce(func.sum(func.length(attempt_logs.c.data)), 0)
    with reading(engine) as conn:
        return int(conn.execute(select(size)).scalar_one())


def evict_logs(engine: Engine, over: int, limit: int = 50, *, dry_run: bool = False) -> int:
    """Delete (``dry_run``: count) the logs of up to ``limit`` terminal instances, the
    least recently changed first, until about ``over`` bytes are freed, in ONE
    transaction; returns the attempts whose log went (0: none left to evict)."""
    owners = (
        select(instances.c.id)
        .where(
            instances.c.status.in_(TERMINAL),
            exists().where(attempt_logs.c.instance_id == instances.c.id),
        )
        .order_by(instances.c.updated_at, instances.c.id)
        .limit(limit)
    )
    freed = attempts_gone = 0
    with reading(engine) if dry_run else engine.begin() as conn:
        for iid in list(conn.execute(owners).scalars()):
            if freed >= over:
                break
            size, count = conn.execute(
                select(
                    func.coalesce(func.sum(func.length(attempt_logs.c.data)), 0),
                    func.count(func.distinct(attempt_logs.c.attempt)),
                ).where(attempt_logs.c.instance_id == iid)
            ).one()
            freed += int(size)
            attempts_gone += int(count)
            if not dry_run:
                conn.execute(delete(attempt_logs).where(attempt_logs.c.instance_id == iid))
    return attempts_gone


def events_after(engine: Engine, after: int, limit: int) -> list[tuple[int, float, float | None]]:
    """The next ``limit`` events with ``id > after`` by id: ``(id, created_at, handled_at)``."""
    stmt = (
        select(events.c.id, events.c.created_at, events.c.handled_at)
        .where(events.c.id > after)
        .order_by(events.c.id)
        .limit(limit)
    )
    with reading(engine) as conn:
        return [tuple(r) for r in conn.execute(stmt)]


def event_refs(engine: Engine, ids: Iterable[int]) -> Counter[int]:
    """``{event id: instances it started still stored}`` for ``ids`` (through the partial
    index ``ix_instances_event``)."""
    ids = list(ids)
    if not ids:
        return Counter()
    d = dialect_of(engine)
    stmt = (
        select(instances.c.event_id, func.count())
        .where(d.ids_in(instances.c.event_id))
        .group_by(instances.c.event_id)
    )
    with reading(engine) as conn:
        return Counter(dict(conn.execute(stmt, {"ids": d.ids_value(ids)}).all()))


def delete_events(engine: Engine, ids: list[int], cutoff: float, *, dry_run: bool = False) -> int:
    """Delete the events ``ids`` still handled before ``cutoff`` and left by every instance
    they started, in ONE transaction; returns how many went (``dry_run``: ``len(ids)``)."""
    if not ids or dry_run:
        return len(ids)
    d = dialect_of(engine)
    started = exists().where(instances.c.event_id == events.c.id)
    stmt = delete(events).where(
        d.ids_in(events.c.id),
        events.c.handled_at.is_not(None),
        events.c.handled_at < cutoff,
        ~started,
    )
    with engine.begin() as conn:
        return conn.execute(stmt, {"ids": d.ids_value(ids)}).rowcount


def delete_workers(engine: Engine, cutoff: float, *, dry_run: bool = False) -> int:
    """Delete (or count) the workers rows silent since before ``cutoff`` that lock no
    instance; returns how many."""
    holding = exists().where(instances.c.locked_by == workers.c.id)
    cond = (workers.c.heartbeat_at < cutoff, ~holding)
    if dry_run:
        with reading(engine) as conn:
            return conn.execute(select(func.count()).select_from(workers).where(*cond)).scalar_one()
    with engine.begin() as conn:
        return conn.execute(delete(workers).where(*cond)).rowcount


def _on_version() -> tuple[Any, ...]:
    return (
        instances.c.flow == flow_versions.c.flow,
        instances.c.version == flow_versions.c.version,
    )


def versions(engine: Engine, *, count: bool) -> list[tuple[str, str, float, int]]:
    """Every stored flow version: ``(version, flow, loaded_at, instances)``, where
    ``instances`` counts the instances on it (``count``) or is 0/1 (whether any is:
    cheaper, it stops at the first)."""
    ref: ColumnElement[int]
    if count:
        ref = select(func.count()).where(*_on_version()).scalar_subquery()
    else:
        ref = case((exists().where(*_on_version()), 1), else_=0)
    stmt = select(flow_versions.c.version, flow_versions.c.flow, flow_versions.c.loaded_at, ref)
    with reading(engine) as conn:
        return [tuple(r) for r in conn.execute(stmt)]


def delete_versions(engine: Engine, names: list[str], *, dry_run: bool = False) -> int:
    """Delete the flow versions ``names`` no instance refers to (re-checked), in ONE
    transaction; returns how many went (``dry_run``: ``len(names)``)."""
    if not names or dry_run:
        return len(names)
    used = exists().where(*_on_version())
    with engine.begin() as conn:
        return conn.execute(
            delete(flow_versions).where(flow_versions.c.version.in_(names), ~used)
        ).rowcount


def flows_stored(engine: Engine) -> list[str]:
    """The names of every flow with a stored version (every instance's flow has one)."""
    with reading(engine) as conn:
        return sorted(conn.execute(select(flow_versions.c.flow).distinct()).scalars())
