"""The durable side of sensors: event rows, cursors and sensor leases.

Every sensor writes its events here first (``INSERT ... ON CONFLICT DO NOTHING`` on the
unique ``(sensor, key)``), in the same transaction as its cursor, so a crash either keeps
both or neither. Rules consume the rows later (``runner.sensors.rules``).

A sensor runs in one daemon at a time: its ``sensors`` row carries a lease
(``locked_by``/``locked_until``, float epoch seconds). Cursor writes are fenced by
``locked_by``: a daemon that lost the lease gets :class:`LeaseLost` and rolls back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select, update

from runner.store.clock import db_now
from runner.store.db import insert_ignore, reading
from runner.store.dead import dead_holders
from runner.store.notify import notify_event
from runner.store.tables import events, sensors


class LeaseLost(Exception):
    """The sensor's lease is held by another daemon now; stop the sensor."""


def record_events(
    engine: Engine,
    sensor: str,
    rows: Sequence[tuple[str, dict[str, Any]]],
    *,
    cursor: dict[str, Any] | None = None,
    worker_id: str | None = None,
) -> None:
    """Store events (and optionally the sensor's new cursor) in ONE transaction.

    Args:
        engine: the database.
        sensor: ``"<flow>.<sensor>"``.
        rows: ``(key, payload)`` pairs; a key already stored for this sensor is skipped.
        cursor: the sensor's new cursor JSON, written only while ``worker_id`` holds the
            lease (else :class:`LeaseLost` is raised and nothing is stored).
        worker_id: the lease holder writing the cursor (needed with ``cursor``).
    """
    at = db_now(engine)
    with engine.begin() as conn:
        for key, payload in rows:
            insert_ignore(
                conn,
                events,
                {"sensor": sensor, "key": key, "payload": payload, "created_at": at},
            )
        if rows:
            notify_event(conn)  # the rule engines of other daemons (PostgreSQL)
        if cursor is not None:
            done = conn.execute(
                update(sensors)
                .where(sensors.c.name == sensor, sensors.c.locked_by == worker_id)
                .values(cursor=cursor, updated_at=at)
            ).rowcount
            if not done:
                raise LeaseLost(f"sensor {sensor}: lease lost by {worker_id}")


def store_event(engine: Engine, sensor: str, key: str, payload: dict[str, Any]) -> int:
    """Store ONE event of ``sensor`` (``"<flow>.<sensor>"``) under ``key`` (unique for
    the sensor) and return its id, once committed: a webhook's request is answered only
    after this returns. No lease: any daemon may store it."""
    with engine.begin() as conn:
        event_id = conn.execute(
            events.insert()
            .values(sensor=sensor, key=key, payload=payload, created_at=db_now(engine))
            .returning(events.c.id)
        ).scalar_one()
        notify_event(conn)  # the rule engines of every daemon (PostgreSQL)
    return int(event_id)


def load_cursor(engine: Engine, sensor: str) -> dict[str, Any]:
    """The stored cursor JSON of ``sensor`` (``{}`` when none)."""
    with reading(engine) as conn:
        value = conn.execute(select(sensors.c.cursor).where(sensors.c.name == sensor)).scalar()
    return dict(value or {})


def claim_leases(engine: Engine, names: Iterable[str], worker_id: str, lease: float) -> set[str]:
    """Claim or renew the leases of ``names`` for ``worker_id``; return the names held now.

    A lease is taken when free (``locked_until`` NULL or past), already ours, or held by
    a worker of this host whose process is provably dead (``runner.store.dead``: taken
    over at once, not when it expires); it then runs until ``now + lease`` (seconds).
    Missing ``sensors`` rows are created. A renewal
    of leases already held is one ``UPDATE ... RETURNING``; only the names it did not
    return (a new sensor, or one another daemon holds) are inserted and tried again.
    """
    names = sorted(set(names))
    if not names:
        return set()
    at = db_now(engine)  # the database's clock: leases shared by hosts
    with engine.begin() as conn:
        held = _take(conn, names, [worker_id], at, lease)
        missing = [n for n in names if n not in held]
        if missing:
            for name in missing:
                insert_ignore(conn, sensors, {"name": name, "cursor": {}, "updated_at": at})
            owners = [worker_id, *dead_holders(conn, sensors, worker_id)]
            held |= _take(conn, missing, owners, at, lease)
        return held


def _take(conn, names: list[str], owners: list[str], at: float, lease: float) -> set[str]:
    """The leases of ``names`` that are free or held by one of ``owners``, taken for
    ``owners[0]`` until ``at + lease`` (inside the caller's transaction); returns their
    names."""
    worker_id = owners[0]
    return set(
        conn.execute(
            update(sensors)
            .where(
                sensors.c.name.in_(names),
                or_(
                    sensors.c.locked_by.in_(owners),
                    sensors.c.locked_until.is_(None),
                    sensors.c.locked_until < at,
                ),
            )
            .values(locked_by=worker_id, locked_until=at + lease)
            .returning(sensors.c.name)
        ).scalars()
    )


def release_leases(engine: Engine, worker_id: str, names: Iterable[str] | None = None) -> None:
    """Give up ``worker_id``'s sensor leases (all of them, or only ``names``)."""
    cond = [sensors.c.locked_by == worker_id]
    if names is not None:
        names = list(names)
        if not names:
            return
        cond.append(sensors.c.name.in_(names))
    with engine.begin() as conn:
        conn.execute(update(sensors).where(and_(*cond)).values(locked_by=None, locked_until=None))


def pending_events(engine: Engine) -> int:
    """Number of stored events no rule has handled yet."""
    with reading(engine) as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(events).where(events.c.handled_at.is_(None))
            ).scalar_one()
        )
