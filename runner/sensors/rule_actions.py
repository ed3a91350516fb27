"""What a rule does for one event: :func:`plan` (what it would do, reading only:
``Planned``) and :func:`act` (do it in the caller's transaction), split so that
``flowrun events replay --dry-run`` and ``rules test`` can show the plan without acting
(``runner.sensors.replay``); the match of a rule's selector on an event's fields
(:func:`matches`) and the one line of a rule that could not act (:func:`rule_error`).
The rule engine that runs them on each stored event, exactly once, is
``runner.sensors.rules``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection

from runner import lifecycle
from runner.errors import IllegalMove, UserError
from runner.ops import commands
from runner.store import create
from runner.store.clock import db_now
from runner.store.flow_limits import refusal
from runner.store.once_per import queue
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
        return plan_delivery(flow, rule, payload)
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


def plan_delivery(flow: Any, rule: Any, payload: dict[str, Any]) -> Planned:
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
