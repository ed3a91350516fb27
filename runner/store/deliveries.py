"""The durable side of alerts: deliveries a rule's ``exec``/``webhook`` owes, their leases
and results (the ``deliveries`` table, ``runner.store.tables.Delivery``).

A delivery is queued in the rule's transaction (:func:`queue_many`, with the event's
``handled_at``; ``runner.store.once_per`` folds the ones a ``once_per`` key holds back),
so an event handled is never without its delivery. Any daemon claims due
deliveries under a lease (:func:`claim_due`); the daemon whose rules queue one queues it
already claimed by itself (:func:`queue_many`'s ``held_by``), so its deliverer sends it
without a claim's transaction. One whose daemon died is claimed again when its lease
expires, or at once when the holder is provably dead (``runner.store.dead``): at least
once. Results are written only while the lease is still the claimer's
(:func:`finish`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, or_, select, update

from runner.store.clock import db_now
from runner.store.db import reading
from runner.store.dead import dead_holders
from runner.store.dialect import dialect_of
from runner.store.tables import deliveries, events


@dataclass
class Claimed:
    """A delivery claimed for sending: its row's id, its rule (``rule:<flow>#<n>``), its
    ``target``, attempts so far, when to give up (epoch s), the event (id, sensor,
    payload) and ``folded_before`` (events its once_per key folded before it)."""

    id: int
    rule: str
    target: dict[str, Any]
    attempts: int
    give_up_at: float
    event_id: int
    sensor: str
    payload: dict[str, Any]
    folded_before: int


def queue_many(
    conn: Connection,
    rows: list[dict[str, Any]],
    *,
    at: float | None = None,
    held_by: str | None = None,
    lease: float = 0.0,
) -> list[int]:
    """Queue deliveries in the caller's transaction, in ONE statement (a batch of
    events' deliveries, not a statement each); each of ``rows`` has ``event_id``,
    ``rule`` (``rule:<flow>#<n>``), ``target`` and ``retry_for`` (seconds), and may have
    ``once_key``, ``suppressed`` and ``folded_before`` (``runner.store.once_per`` decides
    those; default none, 0, 0). ``at``: the database's time, epoch s (read when ``None``). With
    ``held_by`` they are queued already claimed by that daemon for ``lease`` seconds
    (its rules hand them to its deliverer: no :func:`claim_due` transaction). Returns
    the new ids, in the order of ``rows``."""
    if not rows:
        return []
    at = db_now(conn) if at is None else at
    until = None if held_by is None else at + lease
    d = deliveries.c
    values = [
        {
            "event_id": r["event_id"],
            "rule": r["rule"],
            "target": r["target"],
            "status": "pending",
            "created_at": at,
            "due_at": at,
            "give_up_at": at + r["retry_for"],
            "attempts": 0,
            "once_key": r.get("once_key"),
            "suppressed": r.get("suppressed", 0),
            "folded_before": r.get("folded_before", 0),
            "locked_by": held_by,
            "locked_until": until,
        }
        for r in rows
    ]
    keys = [(r["event_id"], r["rule"]) for r in rows]
    if len(set(keys)) < len(keys):  # not one a rule and event: ids in the rows' order
        stmt = deliveries.insert().returning(d.id, sort_by_parameter_order=True)
        return list(conn.execute(stmt, values).scalars())
    # matched back by (event, rule): no ``sort_by_parameter_order``, which SQLite would
    # run one row a statement
    got = conn.execute(deliveries.insert().returning(d.id, d.event_id, d.rule), values).all()
    ids = {(e, r): i for i, e, r in got}
    return [ids[k] for k in keys]


def claim_due(engine: Engine, worker_id: str, lease: float, limit: int = 32) -> list[Claimed]:
    """Claim up to ``limit`` pending deliveries due now and not held (or held by a
    provably dead daemon) for ``lease`` seconds; returns them with their events.

    A read first (its index only): when no delivery is due but those ``worker_id``
    holds (in flight), no write transaction is begun and no holder is looked at (a
    look after each batch its own rules handed over takes no write lock on SQLite)."""
    d = deliveries.c
    with reading(engine) as conn:
        at = db_now(conn)
        not_mine = or_(d.locked_by.is_(None), d.locked_by != worker_id, d.locked_until < at)
        others = select(d.id).where(d.status == "pending", d.due_at <= at, not_mine).limit(1)
        if conn.execute(others).first() is None:
            return []
    with engine.begin() as conn:
        at = db_now(conn)
        free = or_(d.locked_until.is_(None), d.locked_until < at)
        dead = dead_holders(conn, deliveries, worker_id)
        if dead:
            free = or_(free, d.locked_by.in_(dead))
        due = (
            select(d.id)
            .where(d.status == "pending", d.due_at <= at, free)
            .order_by(d.due_at)
            .limit(limit)
        )
        if dialect_of(conn).skip_locked:
            due = due.with_for_update(skip_locked=True)
        ids = list(conn.execute(due).scalars())
        if not ids:
            return []
        rows = conn.execute(
            update(deliveries)
            .where(d.id.in_(ids))
            .values(locked_by=worker_id, locked_until=at + lease)
            .returning(
                d.id, d.rule, d.target, d.attempts, d.give_up_at, d.event_id, d.folded_before
            )
        ).all()
        payloads = {
            r.id: (r.sensor, r.payload)
            for r in conn.execute(
                select(events.c.id, events.c.sensor, events.c.payload).where(
                    events.c.id.in_([r.event_id for r in rows])
                )
            )
        }
    out = []
    for r in rows:
        sensor, payload = payloads.get(r.event_id, ("", {}))
        out.append(
            Claimed(
                r.id,
                r.rule,
                dict(r.target),
                r.attempts,
                r.give_up_at,
                r.event_id,
                sensor,
                dict(payload or {}),
                r.folded_before,
            )
        )
    return sorted(out, key=lambda c: c.id)


@dataclass(frozen=True)
class Try:
    """One try of a claimed delivery, to record (:func:`finish`): ``delivery_id``,
    ``result`` (``"HTTP 200"``, ``"exit 1: ..."``, ``"connection refused"``),
    ``delivered``, and ``retry_at`` (epoch s when it is due again; ``None`` or past its
    ``give_up_at``: failed for good). ``tried`` False: never sent (given back, due as it
    was, its attempts and last result unchanged)."""

    delivery_id: int
    result: str
    delivered: bool
    retry_at: float | None = None
    tried: bool = True


_d = deliveries.c
#: A try recorded: one statement for the batch's tries (``executemany``).
_RECORD = (
    update(deliveries)
    .where(_d.id == bindparam("did"))
    .values(
        attempts=_d.attempts + 1,
        last_result=bindparam("result"),
        status=bindparam("new_status"),
        delivered_at=bindparam("delivered"),
        due_at=bindparam("due"),
        locked_by=None,
        locked_until=None,
    )
)
#: A delivery given back untried: its lease only.
_GIVE_BACK = (
    update(deliveries).where(_d.id == bindparam("did")).values(locked_by=None, locked_until=None)
)


def finish(engine: Engine, worker_id: str, tries: list[Try]) -> list[str | None]:
    """Record ``tries`` of deliveries claimed by ``worker_id``, in ONE transaction (a
    claimed batch's tries together, in two statements at most, not one a delivery).
    Returns each try's new status (``"delivered"``, ``"failed"``, ``"pending"``),
    ``None`` where the lease was no longer ours (nothing written)."""
    if not tries:
        return []
    out: list[str | None] = []
    with engine.begin() as conn:
        at = db_now(conn)
        ids = [x.delivery_id for x in tries]
        held = dict(
            conn.execute(
                select(_d.id, _d.give_up_at).where(_d.id.in_(ids), _d.locked_by == worker_id)
            ).all()
        )
        recorded, given_back = [], []
        for x in tries:
            if x.delivery_id not in held:
                out.append(None)
                continue
            if not x.tried:
                given_back.append({"did": x.delivery_id})
                out.append("pending")
                continue
            due, delivered_at = None, None
            if x.delivered:
                status, delivered_at = "delivered", at
            elif x.retry_at is None or x.retry_at > held[x.delivery_id]:
                status = "failed"
            else:
                status, due = "pending", x.retry_at
            recorded.append(
                {
                    "did": x.delivery_id,
                    "result": x.result,
                    "new_status": status,
                    "delivered": delivered_at,
                    "due": due,
                }
            )
            out.append(status)
        if recorded:
            conn.execute(_RECORD, recorded)
        if given_back:
            conn.execute(_GIVE_BACK, given_back)
    return out


def next_due(engine: Engine) -> float | None:
    """When the earliest pending delivery is due or its lease expires (epoch s), or
    ``None`` when none is pending."""
    d = deliveries.c
    with reading(engine) as conn:
        return conn.execute(
            select(func.min(func.coalesce(d.locked_until, d.due_at))).where(d.status == "pending")
        ).scalar()


def untried(engine: Engine) -> int:
    """How many deliveries were queued and never tried yet (work a daemon about to exit
    when idle still owes; one failing and waiting for its retry is not counted)."""
    d = deliveries.c
    with reading(engine) as conn:
        return int(
            conn.execute(
                select(func.count())
                .select_from(deliveries)
                .where(d.status == "pending", d.attempts == 0)
            ).scalar_one()
        )


def of_events(engine: Engine, event_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The deliveries of each event in ``event_ids`` (``{event id: [row dicts]}``), in
    the order they were queued (for ``flowrun events`` and the console)."""
    if not event_ids:
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    d = deliveries.c
    with reading(engine) as conn:
        for r in conn.execute(
            select(deliveries).where(d.event_id.in_(event_ids)).order_by(d.id)
        ).mappings():
            out.setdefault(r["event_id"], []).append(dict(r))
    return out
