"""Rules: turn stored sensor events into actions, each event exactly once.

For a batch of pending events (``handled_at IS NULL``, read without the write lock; an
idle poll writes nothing), in one transaction: claim them with
``UPDATE events SET handled_at=now WHERE id IN (...) AND handled_at IS NULL RETURNING id``
(an event another daemon got first is not returned and is skipped), run every rule of the
event's flow whose ``when`` is the event's sensor and whose ``match`` regexes all
``re.search`` the event's fields, and write what was done to ``events.action``. A crash
before the commit undoes the claim and the actions together; nothing is lost or doubled.

A selector's ``data`` regexes may name event fields as ``{event.x}``: the value is put in
escaped (``re.escape``), so it matches literally (e.g. ``path: "^{event.path}$"``).

Each rule runs in a savepoint: a rule that fails (a template naming a missing event field,
an unknown flow) is recorded as ``error: ...`` on the event and undoes only itself. An
``exec``/``webhook`` rule without ``once_per`` needs none (it is planned before the write
transaction begins and fails, if at all, there): the batch's delivery rows are one
statement, and in a daemon they are queued already claimed by its own deliverer
(``deliver_as``: no claim's transaction to send them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, bindparam, select, update

from runner.sensors.base import log
from runner.sensors.lifecycle import enrich_many
from runner.sensors.rule_actions import (
    RULE_ERRORS,
    act,
    matches,
    plan,
    plan_delivery,
    rule_error,
)
from runner.store.clock import db_now
from runner.store.db import reading
from runner.store.deliveries import Claimed
from runner.store.once_per import queue_folding
from runner.store.tables import JSONType, events

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.registry import FlowRegistry
    from runner.flowspec.spec_rules import RuleSpec

_SET_ACTION = update(events).where(events.c.id == bindparam("eid")).values(action=bindparam("text"))
_SET_BOTH = (  # an enriched lifecycle event's: one statement a row, not two
    update(events)
    .where(events.c.id == bindparam("eid"))
    .values(action=bindparam("text"), payload=bindparam("payload", type_=JSONType))
)


@dataclass
class _Queued:
    """A delivery planned in a batch (``action``: ``exec`` or ``webhook``; ``row``: what
    ``runner.store.deliveries.queue_many`` writes), written with the batch's others;
    ``text`` says so in its event's action once written."""

    action: str
    row: dict[str, Any]
    text: str = ""
    did: int = 0  # its delivery, once written (or the one it folded into)
    made: bool = False  # a delivery was queued for it (not folded: ``once_per``)
    folded_before: int = 0  # what its once_per key folded before it


@dataclass
class _Later:
    """A rule acted on inside the claim's transaction, in a savepoint (it reads or writes
    more than its delivery row): ``source`` names it (``rule:<flow>#<n>``)."""

    flow: CompiledFlow
    rule: RuleSpec
    source: str


@dataclass
class _Failed:
    """A plain delivery whose plan failed (a template naming a missing field): ``text``."""

    text: str


def _joined(texts: list[str | _Queued]) -> str:
    """An event's action text: what each matching rule did, ``; ``-separated."""
    return "; ".join(t if isinstance(t, str) else t.text for t in texts)


class RuleEngine:
    """Handles pending events in batches.

    Args:
        engine: the database.
        registry: the ``FlowRegistry`` (``.flows: dict[str, CompiledFlow]``, ``.get(name)``).
        batch: events handled per transaction.
        deliver_as: ``(worker id, lease seconds)`` of this daemon's deliverer: the
            deliveries a batch queues are queued already claimed by it and kept in
            :attr:`handed` (``None``: queued free, for any daemon's ``claim_due``).
    """

    def __init__(
        self,
        engine: Engine,
        registry: FlowRegistry,
        *,
        batch: int = 100,
        deliver_as: tuple[str, float] | None = None,
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.batch = batch
        self.deliver_as = deliver_as
        #: Actions taken (instances started, commands applied), by event sensor (metrics).
        self.actions: Counter[str] = Counter()
        #: Deliveries queued claimed by ``deliver_as``, for its deliverer to take
        #: (``runner.sensors.deliver.Deliverer.hand``).
        self.handed: list[Claimed] = []

    def handle_pending(self) -> tuple[int, int]:
        """Handle up to ``batch`` pending events in one transaction (blocking).

        Every rule is planned before the write transaction begins: an ``exec``/``webhook``
        writes nothing but its delivery row and its plan reads nothing, so inside the
        transaction (SQLite's write lock, which the worker's commits wait for) it is only
        the batch's ONE ``INSERT`` of delivery rows and, for ``once_per`` ones, a read and
        an ``UPDATE`` per key (``runner.store.once_per.queue_folding``); other rules run
        there, each in a savepoint.

        Returns:
            ``(events seen, actions taken)``; fewer than ``batch`` seen means none are left.
        """
        acted = 0
        by_sensor: Counter[str] = Counter()
        # a read first: an idle poll (every 0.5 s on SQLite) takes no write lock and
        # writes nothing; the claim below still decides which daemon handles an event
        with reading(self.engine) as conn:
            rows = conn.execute(
                select(events.c.id, events.c.sensor, events.c.payload)
                .where(events.c.handled_at.is_(None))
                .order_by(events.c.id)
                .limit(self.batch)
            ).all()
        if not rows:
            return 0, 0
        at = db_now(self.engine)  # handled_at: the database's clock, as created_at
        rows, enriched = self._enrich(rows, at)
        planned = [self._plan_rules(*row) for row in rows]
        with self.engine.begin() as conn:
            claimed = set(
                conn.execute(
                    update(events)
                    .where(events.c.id.in_([r[0] for r in rows]), events.c.handled_at.is_(None))
                    .values(handled_at=at)
                    .returning(events.c.id)
                ).scalars()
            )
            done: list[tuple[int, list[str | _Queued]]] = []
            queued: list[_Queued] = []
            for (event_id, sensor, payload), items in zip(rows, planned, strict=True):
                if event_id not in claimed:
                    continue  # another daemon handled it first
                texts, n = self._apply_rules(conn, event_id, sensor, payload or {}, items)
                queued += (t for t in texts if isinstance(t, _Queued))
                acted += n
                by_sensor[sensor] += n
                done.append((event_id, texts))
            self._queue(conn, queued, at)
            sensors = {r[0]: r[1] for r in rows}
            for q in queued:  # a delivery queued is an action; one folded by once_per not
                if q.made:
                    acted += 1
                    by_sensor[sensors[q.row["event_id"]]] += 1
            richer = {e["eid"]: e["payload"] for e in enriched}
            plain = [{"eid": e, "text": _joined(t)} for e, t in done if e not in richer]
            both = [
                {"eid": e, "text": _joined(t), "payload": richer[e]} for e, t in done if e in richer
            ]
            if plain:
                conn.execute(_SET_ACTION, plain)
            if both:
                conn.execute(_SET_BOTH, both)
        if self.deliver_as is not None:
            payloads = {r[0]: (r[1], r[2]) for r in rows}
            self.handed += (
                Claimed(
                    q.did,
                    q.row["rule"],
                    q.row["target"],
                    0,
                    at + q.row["retry_for"],
                    q.row["event_id"],
                    payloads[q.row["event_id"]][0],
                    dict(payloads[q.row["event_id"]][1] or {}),
                    q.folded_before,
                )
                for q in queued
                if q.made
            )
        self.actions.update(by_sensor)
        return len(rows), acted

    def _queue(self, conn: Connection, queued: list[_Queued], at: float) -> None:
        """Write the batch's planned deliveries in one ``INSERT``, the ``once_per`` ones
        folded where their key says (``once_per.queue_folding``); each ``_Queued`` gets
        its delivery, whether one was made for it (not folded) and its text."""
        held_by, lease = self.deliver_as or (None, 0.0)
        written = queue_folding(conn, [q.row for q in queued], at=at, held_by=held_by, lease=lease)
        for q, (did, made, before) in zip(queued, written, strict=True):
            q.did, q.made, q.folded_before = did, made, before
            if made:
                q.text = f"{q.action} queued (delivery {did})"
            else:
                q.text = f"{q.action} folded into delivery {did} (once_per)"

    def _enrich(self, rows: list[Any], at: float) -> tuple[list[Any], list[dict[str, Any]]]:
        """``rows`` (id, sensor, payload) with each lifecycle event's ``label`` and
        ``explain`` added (read now, outside the claim's transaction, the labels of the
        batch in one read), and the payloads to store (``[{"eid", "payload"}]``)."""
        out = list(rows)
        spots = []
        for n, (_, sensor, payload) in enumerate(rows):
            flow_name, _, sensor_name = sensor.partition(".")
            flow = self.registry.flows.get(flow_name)
            spec = (getattr(flow, "sensors", None) or {}).get(sensor_name)
            if spec is not None and spec.kind == "lifecycle" and payload:
                spots.append(n)
        enriched = []
        richer = enrich_many(self.engine, [rows[n][2] for n in spots], at)
        for n, payload in zip(spots, richer, strict=True):
            event_id, sensor, before = rows[n]
            if payload is not before:
                enriched.append({"eid": event_id, "payload": payload})
                out[n] = (event_id, sensor, payload)
        return out, enriched

    def _plan_rules(
        self, event_id: int, sensor: str, payload: dict[str, Any] | None
    ) -> list[str | _Queued | _Later | _Failed]:
        """What the rules of ``sensor`` matching ``payload`` do, before the write
        transaction: a plain delivery planned (:class:`_Queued`) or failed
        (:class:`_Failed`), any other rule left for the transaction (:class:`_Later`)."""
        payload = payload or {}
        flow_name, _, sensor_name = sensor.partition(".")
        flow = self.registry.flows.get(flow_name)
        if flow is None:
            return [f"no rule: flow {flow_name} is not loaded"]
        out: list[str | _Queued | _Later | _Failed] = []
        for number, rule in enumerate(flow.rules, 1):
            if rule.when != sensor_name or not matches(rule.match, payload):
                continue
            source = f"rule:{flow.name}#{number}"
            if rule.exec is None and rule.webhook is None:
                out.append(_Later(flow, rule, source))
                continue
            try:  # a delivery: its plan reads and writes nothing
                p = plan_delivery(flow, rule, payload)
            except RULE_ERRORS as exc:
                out.append(_Failed(f"{source} error: {rule_error(exc)}"))
                continue
            row = {"event_id": event_id, "rule": source, "target": p.delivery}
            row["retry_for"] = p.retry_for
            if p.once_key is not None:  # once_per: queued or folded with the batch's others
                row.update(once_key=p.once_key, window=p.window)
            out.append(_Queued(p.action, row))
        return out or ["no rule matched"]

    def _apply_rules(
        self,
        conn: Connection,
        event_id: int,
        sensor: str,
        payload: dict[str, Any],
        items: list[str | _Queued | _Later | _Failed],
    ) -> tuple[list[str | _Queued], int]:
        """Do what :meth:`_plan_rules` planned for a claimed event: a rule left for the
        transaction acts in a savepoint; a planned delivery is returned for the caller to
        write with the batch's others. Returns the texts (a queued one's is set when it is
        written) and the actions it took (its deliveries are counted once written)."""
        texts: list[str | _Queued] = []
        acted = 0
        for item in items:
            if isinstance(item, str | _Queued):
                texts.append(item)  # a delivery is counted once written (``_queue``)
                continue
            if isinstance(item, _Failed):
                text = item.text
            else:
                savepoint = conn.begin_nested()
                try:
                    text, n = self._act(conn, item.flow, item.rule, event_id, payload, item.source)
                except RULE_ERRORS as exc:
                    savepoint.rollback()
                    text = f"{item.source} error: {rule_error(exc)}"
                else:
                    savepoint.commit()
                    acted += n
                    texts.append(text)
                    continue
            extra = {"event": event_id, "sensor": sensor}
            log.warning("event %d (%s): %s", event_id, sensor, text, extra=extra)
            texts.append(text)
        return texts, acted

    def _act(
        self,
        conn: Connection,
        flow: CompiledFlow,
        rule: RuleSpec,
        event_id: int,
        payload: dict[str, Any],
        source: str,
    ) -> tuple[str, int]:
        """Run one rule's action inside the caller's transaction: (text, actions taken)."""
        return act(conn, plan(conn, self.registry, flow, rule, payload), event_id, source)
