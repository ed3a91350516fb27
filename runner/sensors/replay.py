"""Rules run again on stored events (``flowrun events replay``) or tried on an event that
never happened (``flowrun rules test``).

A replay is idempotent: an action a rule already took for an event is not taken twice
unless forced. A rule's ``start`` is taken when the event already started an instance of
that flow (``instances.event_id``); a rule's command is taken when a command row of that
rule names the event (``commands.args.event_id``, written by ``rule_actions.act``). A dry run
and a rules test only read: they say which rule matches (and why the others do not) and
what each would do, with its data rendered.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, func, select, update

from runner.errors import UserError
from runner.ops.views import iso
from runner.sensors.rule_actions import RULE_ERRORS, Planned, act, event_field, plan, rule_error
from runner.store.db import reading
from runner.store.tables import commands, events, instances

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.registry import FlowRegistry


@dataclass
class RuleVerdict:
    """One rule of a flow against one event.

    Attributes:
        number: the rule's 1-based position in the flow file (its source is
            ``rule:<flow>#<number>``).
        when: the sensor the rule listens to.
        matched: whether the rule applies to the event.
        why: what decided it (``"sensor is x, not y"``, ``"field 'name' does not match
            '^a'"``, ``"matches"``).
        planned: what it would do (``rule_actions.Planned``), when matched and plannable.
        error: why it could not be planned (a missing event field ...), else ``None``.
        taken: for a replay: the action already taken for this event, else ``None``.
        done: for a replay that ran: what was done, else ``None``.
    """

    number: int
    when: str
    matched: bool
    why: str
    planned: Planned | None = None
    error: str | None = None
    taken: str | None = None
    done: str | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict of this verdict."""
        p = self.planned
        return {
            "rule": self.number,
            "when": self.when,
            "matched": self.matched,
            "why": self.why,
            "action": None
            if p is None
            else {
                "action": p.action,
                "flow": p.flow,
                "data": p.data,
                "ids": p.ids,
                "event": p.event,
            },
            "would": p.describe() if p is not None else None,
            "error": self.error,
            "taken": self.taken,
            "done": self.done,
        }


@dataclass
class EventReplay:
    """What a replay did (or would do) with one stored event."""

    event_id: int
    sensor: str
    payload: dict[str, Any]
    rules: list[RuleVerdict] = field(default_factory=list)
    note: str | None = None


def verdicts(flow: CompiledFlow, sensor: str, payload: dict[str, Any]) -> list[RuleVerdict]:
    """Every rule of ``flow`` judged against an event of sensor ``sensor`` (its name in
    the flow) with ``payload``; nothing planned yet. Raises nothing."""
    out = []
    for number, rule in enumerate(flow.rules, 1):
        if rule.when != sensor:
            out.append(RuleVerdict(number, rule.when, False, f"listens to {rule.when!r}"))
            continue
        why = "matches"
        for name, pattern in (rule.match or {}).items():
            value = event_field(payload, name)
            if value is None:
                why = f"the event has no field {name!r}"
                break
            if not re.search(pattern, str(value)):
                why = f"field {name!r} ({str(value)[:60]!r}) does not match {pattern!r}"
                break
        out.append(RuleVerdict(number, rule.when, why == "matches", why))
    return out


def _plan_all(
    conn: Connection,
    registry: FlowRegistry,
    flow: CompiledFlow,
    payload: dict[str, Any],
    found: list[RuleVerdict],
) -> None:
    for v in found:
        if not v.matched:
            continue
        try:
            v.planned = plan(conn, registry, flow, flow.rules[v.number - 1], payload)
        except RULE_ERRORS as exc:
            v.error = rule_error(exc)


def try_rules(
    engine: Engine, registry: FlowRegistry, flow_name: str, sensor: str, payload: dict[str, Any]
) -> list[RuleVerdict]:
    """``flowrun rules test``: each rule of ``flow_name`` against an event of ``sensor``
    with ``payload``, with what the matching ones would do now. Writes nothing.

    Raises ``UserError(..., 2)`` for an unknown flow or sensor.
    """
    flow = registry.get(flow_name)
    if sensor not in flow.sensors:
        known = ", ".join(flow.sensors) or "none"
        raise UserError(f"flow {flow_name} has no sensor {sensor!r} (sensors: {known})", 2)
    found = verdicts(flow, sensor, payload)
    with reading(engine) as conn:
        _plan_all(conn, registry, flow, payload, found)
    return found


def sensor_payload(
    flow: CompiledFlow,
    sensor: str,
    *,
    event: dict[str, Any] | None = None,
    line: str | None = None,
    path: str | None = None,
) -> dict[str, Any]:
    """The payload sensor ``sensor`` of ``flow`` would store: the given ``event`` as is, a
    tail sensor's ``line`` (its regex's named groups, ``line`` and ``file``), or a files
    sensor's ``path`` (``path`` absolute, ``name``, ``size``: 0 when the file does not exist).

    Raises ``UserError(..., 2)`` for an unknown sensor, an input of the wrong kind for the
    sensor, or a line or path the sensor would not turn into an event.
    """
    spec = flow.sensors.get(sensor)
    if spec is None:
        known = ", ".join(flow.sensors) or "none"
        raise UserError(f"flow {flow.name} has no sensor {sensor!r} (sensors: {known})", 2)
    base = Path(str(flow.path)).parent
    if event is not None:
        return dict(event)
    if line is not None:
        if spec.tail is None:
            raise UserError(f"--line needs a tail sensor; {sensor!r} is not one", 2)
        regex = re.compile(spec.tail.match) if spec.tail.match else None
        m = regex.search(line) if regex else None
        if regex is not None and m is None:
            raise UserError(
                f"sensor {sensor!r} would not record this line: it does not match "
                f"{spec.tail.match!r}",
                2,
            )
        payload = dict(m.groupdict()) if m else {}
        payload.update(line=line, file=str(Path(base, spec.tail.path).absolute()))
        return payload
    if path is not None:
        if spec.files is None:
            raise UserError(f"--path needs a files sensor; {sensor!r} is not one", 2)
        full = Path(path).expanduser().absolute()
        if not fnmatchcase(full.name, spec.files.glob):
            raise UserError(
                f"sensor {sensor!r} would not record {full.name!r}: it does not match "
                f"glob {spec.files.glob!r}",
                2,
            )
        size = full.stat().st_size if full.is_file() else 0
        return {"path": str(full), "name": os.path.basename(full), "size": size}
    raise UserError("give the event: --event JSON, --line TEXT or --path PATH", 2)


def event_ids_since(engine: Engine, since: float) -> list[int]:
    """Ids of the stored events recorded at or after ``since`` (epoch seconds), oldest first."""
    with reading(engine) as conn:
        q = select(events.c.id).where(events.c.created_at >= since).order_by(events.c.id)
        return list(conn.execute(q).scalars())


def replay(
    engine: Engine,
    registry: FlowRegistry,
    event_ids: list[int],
    *,
    dry_run: bool = False,
    force: bool = False,
) -> list[EventReplay]:
    """Run the rules again on stored events (each in its own transaction).

    A matching rule whose action was already taken for the event is skipped unless
    ``force``; with ``dry_run`` nothing is written and each verdict says what would be done.
    A replay appends what it did to the event's ``action`` (``replayed at ...: ...``).

    Raises ``UserError(..., 1)`` when an id is not a stored event (before doing anything).
    """
    ids = list(dict.fromkeys(event_ids))
    with reading(engine) as conn:
        rows = {
            r["id"]: dict(r)
            for r in conn.execute(select(events).where(events.c.id.in_(ids))).mappings()
        }
    missing = [i for i in ids if i not in rows]
    if missing:
        raise UserError(f"no event {', '.join(map(str, missing))}", 1)
    out = []
    for eid in ids:
        ev = rows[eid]
        out.append(_replay_one(engine, registry, ev, dry_run=dry_run, force=force))
    return out


def _replay_one(
    engine: Engine, registry: FlowRegistry, ev: dict[str, Any], *, dry_run: bool, force: bool
) -> EventReplay:
    flow_name, _, sensor = ev["sensor"].partition(".")
    result = EventReplay(ev["id"], ev["sensor"], ev["payload"] or {})
    flow = registry.flows.get(flow_name)
    if flow is None:
        result.note = f"flow {flow_name} is not loaded: no rule to run"
        return result
    result.rules = verdicts(flow, sensor, result.payload)
    if dry_run:
        with reading(engine) as conn:
            _plan_all(conn, registry, flow, result.payload, result.rules)
            _mark_taken(conn, flow, ev, result.rules)
        return result
    at = time.time()
    with engine.begin() as conn:
        _plan_all(conn, registry, flow, result.payload, result.rules)
        _mark_taken(conn, flow, ev, result.rules)
        texts = []
        for v in result.rules:
            if not v.matched or v.planned is None or (v.taken and not force):
                continue
            source = f"rule:{flow.name}#{v.number}"
            savepoint = conn.begin_nested()
            try:
                v.done, _ = act(conn, v.planned, ev["id"], source)
            except RULE_ERRORS as exc:
                savepoint.rollback()
                v.error = rule_error(exc)
            else:
                savepoint.commit()
                texts.append(v.done)
        summary = "; ".join(texts) or "nothing new"
        conn.execute(
            update(events)
            .where(events.c.id == ev["id"])
            .values(
                action=func.coalesce(events.c.action + "; ", "")
                + f"replayed at {iso(at)}: {summary}",
                handled_at=func.coalesce(events.c.handled_at, at),
            )
        )
    return result


def _mark_taken(
    conn: Connection, flow: CompiledFlow, ev: dict[str, Any], found: list[RuleVerdict]
) -> None:
    """Set ``taken`` on each matching rule whose action this event already caused."""
    started: dict[str, int] = dict(
        conn.execute(
            select(instances.c.flow, func.count())
            .where(instances.c.event_id == ev["id"])
            .group_by(instances.c.flow)
        ).all()
    )
    seen_starts: dict[str, int] = {}
    for v in found:
        if not v.matched or v.planned is None:
            continue
        if v.planned.action == "start":
            k = seen_starts[v.planned.flow] = seen_starts.get(v.planned.flow, 0) + 1
            if started.get(v.planned.flow, 0) >= k:
                v.taken = f"this event already started a {v.planned.flow} instance"
            continue
        source = f"rule:{flow.name}#{v.number}"
        rows = conn.execute(
            select(commands.c.instance_id, commands.c.args, commands.c.status).where(
                commands.c.source == source, commands.c.created_at >= ev["created_at"]
            )
        ).all()
        hit = sorted({r.instance_id for r in rows if (r.args or {}).get("event_id") == ev["id"]})
        if hit:
            v.taken = f"already applied for this event to instances {', '.join(map(str, hit))}"
