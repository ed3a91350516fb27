"""Lifecycle events: an instance's transitions stored as sensor events, in the transition's
own transaction.

A ``lifecycle`` sensor (``runner.sensors.lifecycle``) subscribes to kinds of transitions
(``runner.flowspec.spec_sensors.LIFECYCLE_KINDS``) of some flows. Whoever writes a
transition (the worker's commit, an operator or rule command, the recovery of a lost
attempt, a missed deadline) calls
:func:`emit` inside the same transaction: one ``events`` row per subscribed sensor, keyed
by the transition (``"<instance>:a<attempt>"``, ``"<instance>:f<fence>"``, ...), so a
transition is stored once whatever the number of daemons, and never without its event.

Who subscribes is known two ways, merged: the flows this process loaded (:func:`declare`,
by the daemon's sensor hub) and the ``sensors`` rows whose cursor holds ``"lifecycle"``
(written by the daemon running the sensor), read again at most every
:data:`REFRESH` seconds, so a CLI ``flowrun kill`` emits too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from runner.store.clock import db_now
from runner.store.dialect import dialect_of
from runner.store.notify import notify_event
from runner.store.tables import events, instances, sensors

#: Seconds a process trusts the subscriptions it read from the ``sensors`` table.
REFRESH = 2.0


@dataclass(frozen=True)
class Subscription:
    """One ``lifecycle`` sensor: its name (``"<flow>.<sensor>"``), the flows it watches
    (``None``: every flow) and the kinds it listens to."""

    sensor: str
    flows: frozenset[str] | None
    on: frozenset[str]

    def wants(self, flow: str, kind: str, status: str) -> bool:
        """True for a transition of ``flow`` of ``kind`` ending in ``status``; ``failed``
        listens to every transition into status failed (``budget_spent``, ...) too."""
        if self.flows is not None and flow not in self.flows:
            return False
        return kind in self.on or (status == "failed" and "failed" in self.on)

    def cursor(self) -> dict[str, Any]:
        """The sensor row's cursor that publishes this subscription to other processes."""
        flows = None if self.flows is None else sorted(self.flows)
        return {"lifecycle": {"flows": flows, "on": sorted(self.on)}}


class _Known:
    def __init__(self) -> None:
        self.local: dict[str, Subscription] = {}
        self.stored: tuple[Subscription, ...] = ()
        self.read_at = float("-inf")

    def all(self) -> list[Subscription]:
        merged = {s.sensor: s for s in self.stored}
        merged.update(self.local)
        return list(merged.values())


#: By database URL, not ``Engine``: the worker commits through engines of its own (the
#: no-wait engine of ``runner.store.db``) on the same database.
_known: dict[str, _Known] = {}


def _of(engine: Engine) -> _Known:
    key = engine.url.render_as_string(hide_password=True)
    known = _known.get(key)
    if known is None:
        known = _known[key] = _Known()
    return known


def declare(engine: Engine, subs: Iterable[Subscription]) -> None:
    """Set the subscriptions of the flows this process loaded (replacing the previous
    ones), so its transitions emit at once, before the sensor row is written."""
    known = _of(engine)
    known.local = {s.sensor: s for s in subs}
    known.read_at = float("-inf")


def subscription(name: str, spec: Any) -> Subscription:
    """The subscription of ``lifecycle`` sensor ``name`` (``"<flow>.<sensor>"``) whose
    ``SensorSpec`` is ``spec``."""
    life = spec.lifecycle
    flows = None if life.flows is None else frozenset(life.flows)
    return Subscription(name, flows, frozenset(life.on))


def declare_flows(engine: Engine, registry: Any) -> None:
    """Make this process emit lifecycle events for the ``lifecycle`` sensors of
    ``registry``'s flows (a ``FlowRegistry``) from now on, replacing what it declared."""
    declare(
        engine,
        [
            subscription(f"{flow.name}.{sname}", spec)
            for flow in registry.flows.values()
            for sname, spec in (flow.sensors or {}).items()
            if spec.kind == "lifecycle"
        ],
    )


def forget(engine: Engine, names: Iterable[str]) -> None:
    """Stop publishing the subscriptions of sensors ``names`` (removed from their flow):
    their ``sensors`` rows' cursors are emptied."""
    names = list(names)
    with engine.begin() as conn:
        for name, cursor in conn.execute(
            select(sensors.c.name, sensors.c.cursor).where(sensors.c.name.in_(names))
        ).all():
            if from_cursor(name, cursor) is not None:
                conn.execute(update(sensors).where(sensors.c.name == name).values(cursor={}))
    _of(engine).read_at = float("-inf")


def subscriptions(conn: Connection) -> list[Subscription]:
    """Every known subscription (declared here, or stored in the ``sensors`` table at
    most :data:`REFRESH` seconds ago), read inside ``conn``'s transaction when stale."""
    known = _of(conn.engine)
    now = time.monotonic()
    if now - known.read_at > REFRESH:
        rows = conn.execute(select(sensors.c.name, sensors.c.cursor)).all()
        known.stored = tuple(
            sub for name, cursor in rows if (sub := from_cursor(name, cursor)) is not None
        )
        known.read_at = now
    return known.all()


def from_cursor(name: str, cursor: Mapping[str, Any] | None) -> Subscription | None:
    """The subscription a ``sensors`` row publishes (``None`` for another kind)."""
    spec = (cursor or {}).get("lifecycle")
    if not isinstance(spec, Mapping):
        return None

    flows = spec.get("flows")
    return Subscription(
        name, None if flows is None else frozenset(flows), frozenset(spec.get("on") or ())
    )


def iso_utc(at: float) -> str:
    """``at`` (epoch seconds) as ISO 8601 UTC with milliseconds."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def transition(
    key: str, row: Mapping[str, Any], kind: str, worker: str | None, at: float
) -> tuple[str, dict[str, Any]]:
    """One transition as ``(key, payload)`` for :func:`emit`.

    Args:
        key: unique per transition of the instance (``"<id>:a<attempt>"``, ...).
        row: the instance's columns after the transition: ``id``, ``flow``, ``version``,
            ``state``, ``status``, ``attempts``, ``errors``, ``restarts``, ``last_error``
            (reduced to its last non-empty line).
        kind: the lifecycle kind.
        worker: the daemon that wrote the transition (``None``: a command).
        at: when, epoch seconds (stored as ISO 8601 UTC).
    """
    lines = [ln for ln in (row["last_error"] or "").splitlines() if ln.strip()]
    return key, {
        "instance": row["id"],
        "flow": row["flow"],
        "version": row["version"],
        "state": row["state"],
        "status": row["status"],
        "kind": kind,
        "error": lines[-1].strip() if lines else None,
        "attempts": row["attempts"],
        "errors": row["errors"],
        "restarts": row["restarts"],
        "worker": worker,
        "at": iso_utc(at),
    }


def emit(conn: Connection, rows: Iterable[tuple[str, dict[str, Any]]]) -> int:
    """Store each transition ``(key, payload)`` (:func:`transition`) once for every
    subscribed sensor, inside ``conn``'s transaction; returns the rows stored. Nothing is
    read or written when no sensor listens."""
    rows = list(rows)
    if not rows:
        return 0
    subs = subscriptions(conn)
    if not subs:
        return 0
    at = db_now(conn)
    values = [
        {"sensor": s.sensor, "key": key, "payload": p, "created_at": at}
        for key, p in rows
        for s in subs
        if s.wants(p["flow"], p["kind"], p["status"])
    ]
    if values:
        conn.execute(dialect_of(conn).insert(events).on_conflict_do_nothing(), values)
        notify_event(conn)
    return len(values)


def wanted(conn: Connection) -> bool:
    """True when some sensor listens to lifecycle events (cheap: cached)."""
    return bool(subscriptions(conn))


def outcome_kind(outcome: str, status: str) -> str | None:
    """The lifecycle kind of an attempt that ended with ``outcome`` (``moved``, ``error``,
    ...) leaving its instance in ``status``; ``None`` when it is no lifecycle event (a
    move to a non-terminal state, a backoff, a not yet)."""
    if status == "completed":
        return "completed"
    if outcome == "error" and status != "sleeping":
        return "budget_spent"  # on_exhausted: failed, paused or another state
    if outcome in ("timeout", "lost") and status == "failed":
        return "restarts_spent"
    if status == "failed":
        return "failed"
    return None


def outcome_events(
    worker_id: str, outcomes: Iterable[Any], at: float
) -> list[tuple[str, dict[str, Any]]]:
    """The transitions (:func:`transition`) of committed ``outcomes``
    (``runner.store.rows.Outcome``) that are lifecycle events."""
    rows = []
    for o in outcomes:
        v, c = o.values, o.claim
        kind = outcome_kind(o.attempt_values["outcome"], v["status"])
        if kind is not None:
            row = {
                **v,
                "id": c.id,
                "flow": c.flow,
                "version": c.version,
                "attempts": c.attempt,
                "last_error": o.attempt_values["error"] or v["last_error"],  # the cause
            }
            rows.append(transition(f"{c.id}:a{c.attempt}", row, kind, worker_id, at))
    return rows


def emit_lost(conn: Connection, lost: Iterable[Any], at: float) -> int:
    """Emit ``lost`` (or ``restarts_spent``) for each attempt ``recover_lost`` recorded
    (``runner.store.leases.Lost``: ``instance_id``, ``attempt``, ``worker``, ``failed``),
    reading the instances' rows as they are now written; returns the rows stored."""
    lost = list(lost)
    if not lost or not wanted(conn):
        return 0
    i = instances.c
    q = select(
        i.id, i.flow, i.version, i.state, i.status, i.attempts, i.errors, i.restarts, i.last_error
    ).where(i.id.in_([x.instance_id for x in lost]))
    now = {r["id"]: dict(r) for r in conn.execute(q).mappings()}
    return emit(
        conn,
        [
            transition(
                f"{x.instance_id}:a{x.attempt}",
                now[x.instance_id],
                "restarts_spent" if x.failed else "lost",
                x.worker,
                at,
            )
            for x in lost
            if x.instance_id in now
        ],
    )
