"""The ``lifecycle`` sensor: flowrun's own instance transitions as events.

Unlike the other sensors it watches nothing: the events are written by whoever writes the
transition, in the same transaction (``runner.store.lifecycle_events``). What it does is
publish its subscription (the flows and kinds it listens to) in its ``sensors`` row, so
every process (another daemon, a CLI ``flowrun kill``) emits for it; the daemon also
declares the subscriptions of its own flows at once
(``runner.store.lifecycle_events.declare_flows``).

At handling time (``runner.sensors.rules``) an event gets the fields that are too costly
for the transition's transaction: ``label`` and ``explain`` (:func:`enrich`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine, select

from runner.sensors.base import Sensor
from runner.store.db import reading
from runner.store.lifecycle_events import subscription
from runner.store.tables import instances

#: Timeline entries of ``flowrun explain`` kept in an event's ``explain`` (the latest).
EXPLAIN_ENTRIES = 4


class LifecycleSensor(Sensor):
    """Publishes its subscription in its ``sensors`` row (the cursor), then waits."""

    async def run(self, stop: asyncio.Event) -> None:
        await self.store([], subscription(self.name, self.spec).cursor())
        self.started.set()
        await stop.wait()


#: The kinds whose events say why (``explain``): those that end or stall an instance.
#: The others (``completed``, ``paused``, ``resumed``, ``retried``) need no why and can
#: come by the thousand: their ``explain`` is ``""`` and only the label is read.
EXPLAINED = frozenset(
    {"failed", "budget_spent", "restarts_spent", "killed", "lost", "deadline_missed"}
)


def enrich_many(engine: Engine, payloads: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """:func:`enrich` of each of ``payloads`` (lifecycle events' payloads), in order: the
    labels of the kinds that need no why are read in ONE query for the batch (a
    thousand ``completed`` a second cost one read, not a thousand); the
    :data:`EXPLAINED` kinds are explained one by one."""
    plain = [
        "explain" not in p and isinstance(p.get("instance"), int) and p.get("kind") not in EXPLAINED
        for p in payloads
    ]
    labels: dict[int, str | None] = {}
    if any(plain):
        ids = {p["instance"] for p, label_only in zip(payloads, plain, strict=True) if label_only}
        with reading(engine) as conn:
            q = select(instances.c.id, instances.c.label).where(instances.c.id.in_(ids))
            labels = {row.id: row.label for row in conn.execute(q)}
    out = []
    for p, label_only in zip(payloads, plain, strict=True):
        if not label_only:
            out.append(enrich(engine, p, now))
        elif p["instance"] in labels:
            out.append({**p, "label": labels[p["instance"]], "explain": ""})
        else:
            out.append(p)  # an instance no longer stored
    return out


def enrich(engine: Engine, payload: dict[str, Any], now: float) -> dict[str, Any]:
    """``payload`` of a lifecycle event with ``label`` and, for the :data:`EXPLAINED`
    kinds, ``explain`` (the header of ``flowrun explain`` and its latest timeline
    entries, then what happens next; ``""`` for the others), read now (``now``: epoch
    seconds); unchanged for an instance no longer stored."""
    from runner.ops.detail import instance_rows, stored_flow
    from runner.ops.explain import explain
    from runner.ops.explanation import render_text

    if "explain" in payload or not isinstance(payload.get("instance"), int):
        return payload
    if payload.get("kind") not in EXPLAINED:
        with reading(engine) as conn:
            q = select(instances.c.label).where(instances.c.id == payload["instance"])
            row = conn.execute(q).first()
        return payload if row is None else {**payload, "label": row.label, "explain": ""}
    rows = instance_rows(engine, payload["instance"])
    if rows is None:
        return payload
    text = render_text(explain(rows, lambda v: stored_flow(engine, v), now), now)
    return {**payload, "label": rows["instance"].get("label"), "explain": short_explain(text)}


def short_explain(text: str) -> str:
    """The first two lines of an ``explain`` text, its last :data:`EXPLAIN_ENTRIES`
    timeline entries and its forecast."""
    lines = text.splitlines()
    try:
        happened = lines.index("What happened (times UTC; +time since it was created):")
        nxt = next(i for i, ln in enumerate(lines) if ln.startswith("What happens next"))
    except (ValueError, StopIteration):
        return "\n".join(lines[:8])
    entries = [ln for ln in lines[happened + 1 : nxt] if ln.lstrip().startswith(("- ", "· "))]
    return "\n".join([*lines[:2], *entries[-EXPLAIN_ENTRIES:], *lines[nxt:]]).rstrip()
