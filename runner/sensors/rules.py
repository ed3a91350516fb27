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

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine, bindparam, select, update

from runner import lifecycle
from runner.errors import IllegalMove, UserError
from runner.ops import commands
from runner.sensors.base import log
from runner.sensors.lifecycle import enrich_many
from runner.store import create
from runner.store.clock import db_now
from runner.store.db import reading
from runner.store.deliveries import Claimed, queue, queue_many
from runner.store.flow_limits import refusal
from runner.store.tables import JSONType, events
from runner.templating import lookup, render, render_event_refs, render_value

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.registry import FlowRegistry
    from runner.flowspec.spec_rules import RuleSpec

#: Statuses each rule command can act on (from the lifecycle table), so a rule selecting
#: "every csv_ingest instance" does not log a refusal for each finished one.
_ACTIONABLE = {event: sources for event, sources, _ in lifecycle.TABLE}

#: Errors of a rule that are the flow author's, not the database's: recorded, not retried.
RULE_ERRORS = (UserError, IllegalMove, KeyError, ValueError, LookupError, re.error)


def rule_error(exc: BaseException) -> str:
    """One line saying why a rule that matched could not act (``exc`` one of
    ``RULE_ERRORS``): a template naming a missing field says which field, of what."""
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        head, _, rest = exc.args[0].partition(".")
        whose = {"event": "the event", "data": "the started flow's data"}.get(head)
        if whose and rest:
            return f"{whose} has no field {rest!r} (named by {{{exc.args[0]}}})"
    return str(exc)


_SET_ACTION = update(events).where(events.c.id == bindparam("eid")).values(action=bindparam("text"))
_SET_BOTH = (  # an enriched lifecycle event's: one statement a row, not two
    update(events)
    .where(events.c.id == bindparam("eid"))
    .values(action=bindparam("text"), payload=bindparam("payload", type_=JSONType))
)


def event_field(payload: Mapping[str, Any], field: str) -> Any:
    """``payload[field]``, or for a dotted ``field`` absent as such (``body.ref``) the
    value at that path in nested fields; ``None`` when missing."""
    value = payload.get(field)
    if value is None and "." in field:
        try:
            value = lookup(payload, field)
        except KeyError:
            return None
    return value


def matches(patterns: Mapping[str, str] | None, payload: Mapping[str, Any]) -> bool:
    """True when every ``field -> regex`` of ``patterns`` ``re.search``-es ``payload[field]``
    (as text; a missing field or ``None`` does not match). A dotted field (``body.ref``,
    ``headers.x-github-event``) is a path into nested fields (a webhook's)."""
    for field, pattern in (patterns or {}).items():
        value = event_field(payload, field)
        if value is None or not re.search(pattern, str(value)):
            return False
    return True


@dataclass
class _Queued:
    """A delivery planned in a batch (``action``: ``exec`` or ``webhook``; ``row``: what
    ``runner.store.deliveries.queue_many`` writes), written with the batch's others;
    ``text`` says so in its event's action once written."""

    action: str
    row: dict[str, Any]
    text: str = ""


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
        deliver_as: ``(worker id, lease seconds)`` of this daemon's deliverer: the batch's
            plain deliveries are queued already claimed by it and kept in
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

        Every rule is planned before the write transaction begins: a plain
        ``exec``/``webhook`` (no ``once_per``) writes nothing but its delivery row and its
        plan reads nothing, so inside the transaction (SQLite's write lock, which the
        worker's commits wait for) it is only the batch's ONE ``INSERT`` of delivery rows
        (``runner.store.deliveries.queue_many``); other rules run there, each in a
        savepoint.

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
        held_by, lease = self.deliver_as or (None, 0.0)
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
            ids = queue_many(conn, [q.row for q in queued], at=at, held_by=held_by, lease=lease)
            for q, did in zip(queued, ids, strict=True):
                q.text = f"{q.action} queued (delivery {did})"
            richer = {e["eid"]: e["payload"] for e in enriched}
            plain = [{"eid": e, "text": _joined(t)} for e, t in done if e not in richer]
            both = [
                {"eid": e, "text": _joined(t), "payload": richer[e]} for e, t in done if e in richer
            ]
            if plain:
                conn.execute(_SET_ACTION, plain)
            if both:
                conn.execute(_SET_BOTH, both)
        if held_by is not None:
            payloads = {r[0]: (r[1], r[2]) for r in rows}
            self.handed += (
                Claimed(
                    did,
                    q.row["rule"],
                    q.row["target"],
                    0,
                    at + q.row["retry_for"],
                    q.row["event_id"],
                    payloads[q.row["event_id"]][0],
                    dict(payloads[q.row["event_id"]][1] or {}),
                    0,
                )
                for q, did in zip(queued, ids, strict=True)
            )
        self.actions.update(by_sensor)
        return len(rows), acted

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
            if (rule.exec is None and rule.webhook is None) or rule.once_per:
                out.append(_Later(flow, rule, source))
                continue
            try:  # a plain delivery: its plan reads and writes nothing
                p = _plan_delivery(flow, rule, payload)
            except RULE_ERRORS as exc:
                out.append(_Failed(f"{source} error: {rule_error(exc)}"))
                continue
            row = {"event_id": event_id, "rule": source, "target": p.delivery}
            out.append(_Queued(p.action, {**row, "retry_for": p.retry_for}))
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
        written) and the actions taken."""
        texts: list[str | _Queued] = []
        acted = 0
        for item in items:
            if isinstance(item, str | _Queued):
                texts.append(item)
                acted += isinstance(item, _Queued)
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


@dataclass
class Planned:
    """What one rule would do for one event (``plan``), before anything is written.

    Attributes:
        action: ``start``, ``send``, ``pause``, ``resume`` or ``kill``.
        flow: the flow started, or the flow whose instances the command selects.
        data: for ``start``: the new instance's data from the rule's templates (the flow's
            own ``data:`` defaults are merged under it when the instance is created).
        ids: for a command: the instances it selects now (those it can act on).
        event: for ``send``: the event sent.
        target: for ``start``: the ``CompiledFlow`` started.
        payload: for ``start``: the event's fields (``runs_on`` templates may name them).
    """

    action: str
    flow: str
    data: dict[str, Any] | None = None
    ids: list[int] | None = None
    event: str | None = None
    target: CompiledFlow | None = None
    delivery: dict[str, Any] | None = None
    once_key: str | None = None
    window: float | None = None
    retry_for: float = 3600.0
    payload: dict[str, Any] | None = None

    def describe(self) -> str:
        """One line: ``start csv_ingest with data {...}`` / ``pause 2 csv_ingest instances
        (ids 3, 4)`` / ``webhook POST https://...`` / ``exec ["notify", ...]``."""
        if self.delivery is not None:
            return describe_target(self.delivery)
        if self.action == "start":  # the data the instance gets: the flow's defaults under
            data = {**(getattr(self.target, "data", None) or {}), **(self.data or {})}
            return f"start {self.flow} with data {json.dumps(data, sort_keys=True)}"
        what = f"{self.action} {self.event}" if self.event else self.action
        ids = ", ".join(map(str, self.ids or [])) or "none"
        return f"{what}: {len(self.ids or [])} {self.flow} instances (ids {ids})"


def plan(
    conn: Connection,
    registry: FlowRegistry,
    flow: CompiledFlow,
    rule: RuleSpec,
    payload: dict[str, Any],
) -> Planned:
    """What ``rule`` of ``flow`` would do for an event with ``payload``; reads only.

    Raises one of ``RULE_ERRORS`` (a template naming a missing event field, an unknown
    flow, a rule without an action).
    """
    if rule.exec is not None or rule.webhook is not None:
        return _plan_delivery(flow, rule, payload)
    if rule.start is not None:
        target = registry.get(rule.start)
        context = {"event": payload, "data": dict(target.data or {})}
        data = {k: render_value(v, context) for k, v in (rule.data or {}).items()}
        return Planned("start", target.name, data=data, target=target, payload=payload)
    for command in ("send", "pause", "resume", "kill"):
        selector = getattr(rule, command)
        if selector is None:
            continue
        target_flow = selector.flow or flow.name
        # ``{event.x}`` in a selector regex matches the event's value literally
        data_match = {k: render_event_refs(v, payload) for k, v in (selector.data or {}).items()}
        ids = commands.select_ids(
            conn,
            flow=target_flow,
            state=selector.state,
            status=_ACTIONABLE[command],
            data_match=data_match or None,
        )
        event = getattr(selector, "event", None) if command == "send" else None
        return Planned(command, target_flow, ids=ids, event=event)
    raise ValueError(f"rule of {flow.name} has no action")


def _plan_delivery(flow: Any, rule: Any, payload: dict[str, Any]) -> Planned:
    """A rule's ``exec`` or ``webhook`` for one event: the target with its ``{event.x}``
    rendered (headers are rendered when sent: they may read ``{env.X}``)."""
    context = {"event": payload}
    if rule.exec is not None:
        target: dict[str, Any] = {"exec": [render(a, context) for a in rule.exec]}
    else:
        hook = rule.webhook
        target = {
            "webhook": {
                "url": render(hook.url, context),
                "method": hook.method,
                "headers": dict(hook.headers),
                "body": None if hook.body is None else render(hook.body, context),
                "timeout": hook.timeout,
            }
        }
    once = rule.once_per
    return Planned(
        "exec" if rule.exec is not None else "webhook",
        flow.name,
        delivery=target,
        once_key=None if once is None else render(once.key, context),
        window=None if once is None else once.window,
        retry_for=rule.retry_for,
    )


def describe_target(target: dict[str, Any]) -> str:
    """One line naming a delivery's target: ``exec ["notify", "x"]`` or ``webhook POST
    URL`` (header values never shown)."""
    if "exec" in target:
        return f"exec {json.dumps(target['exec'])}"
    hook = target.get("webhook") or {}
    return f"webhook {hook.get('method', 'POST')} {hook.get('url')}"


def act(conn: Connection, planned: Planned, event_id: int, source: str) -> tuple[str, int]:
    """Do ``planned`` for stored event ``event_id`` in the caller's transaction; returns
    ``(text, actions taken)``. A started instance records the event (``event_id``); each
    command row records it in its ``args`` (``event_id``), so a replay can tell an
    action already taken (``runner.sensors.replay``)."""
    if planned.action == "start":
        target = cast("CompiledFlow", planned.target)  # a start's plan has its flow
        skipped = refusal(conn, target, planned.data or {}, db_now(conn))  # on_limit: skip
        if skipped is not None:
            return f"skipped start of {planned.flow}: {skipped}", 0
        iid = create.create_instance(
            conn, target, planned.data, event_id=event_id, event=planned.payload
        )
        return f"started {planned.flow} instance {iid}", 1
    if planned.delivery is not None:
        did, queued = queue(
            conn,
            event_id,
            source,
            planned.delivery,
            retry_for=planned.retry_for,
            once_key=planned.once_key,
            window=planned.window,
        )
        if not queued:
            return f"{planned.action} folded into delivery {did} (once_per)", 0
        return f"{planned.action} queued (delivery {did})", 1
    results = commands.apply(
        conn,
        planned.ids or [],
        planned.action,
        event=planned.event,
        source=source,
        tag={"event_id": event_id},
    )
    ok = sum(r.ok for r in results)
    what = f"{planned.action} {planned.event}" if planned.event else planned.action
    return f"{what}: {ok} of {len(planned.ids or [])} {planned.flow} instances", ok
