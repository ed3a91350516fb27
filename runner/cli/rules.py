"""``flowrun events replay`` and ``flowrun rules test``: the rules run again on stored
events (idempotent unless ``--force``; ``--dry-run`` writes nothing), or tried on an event
that never happened (writes nothing).

``flowrun events`` (the listing, ``runner.cli.operator``) becomes a group whose default is
that listing, so ``flowrun events [--json] [--limit N]`` keeps working.
"""

from __future__ import annotations

import json

import click

from runner.cli.context import Ctx, pass_ctx
from runner.errors import UserError
from runner.literal import literal


def events_group(listing: click.Command) -> click.Group:
    """A ``flowrun events`` group that runs ``listing`` (the existing ``events`` command,
    with its options) when no subcommand is given, plus ``replay``."""

    @click.pass_context
    def callback(ctx: click.Context, **kwargs):
        if ctx.invoked_subcommand is None:
            ctx.invoke(listing, **kwargs)

    group = click.Group(
        name="events",
        callback=callback,
        params=list(listing.params),
        help=(listing.help or "").split("\f")[0].rstrip()
        + "\n\n`flowrun events replay` runs the rules again on stored events.",
        invoke_without_command=True,
    )
    group.add_command(replay)
    return group


def _since(text: str) -> float:
    """``--since``: an ISO 8601 time (no zone means UTC) or a duration ago (``1h``)."""
    import time

    from runner.control_channel import wake_time
    from runner.durations import parse_duration

    try:
        return time.time() - parse_duration(text)
    except ValueError:
        pass
    try:
        return wake_time(text)
    except ValueError as exc:
        raise UserError(f"--since: {exc}", 2) from None


def _verdict_lines(verdicts, *, replaying: bool, force: bool = False) -> list[str]:
    lines = []
    for v in verdicts:
        head = f"  rule #{v.number} (when {v.when})"
        if not v.matched:
            lines.append(f"{head}: no match: {v.why}")
            continue
        if v.error:
            lines.append(f"{head}: matches, but fails: {v.error}")
            continue
        would = v.planned.describe()
        if v.done:
            lines.append(f"{head}: did: {v.done}")
        elif replaying and v.taken and not force:
            lines.append(f"{head}: skipped ({v.taken}; --force takes it again): {would}")
        else:
            lines.append(f"{head}: would {would}")
    if not any(v.matched for v in verdicts):
        lines.append("  no rule matches")
    return lines


@click.command()
@click.argument("event_ids", nargs=-1, type=int)
@click.option("--since", metavar="TIME", help="Also every event since TIME (ISO 8601, or 1h ago).")
@click.option("--dry-run", is_flag=True, help="Say what would be done; write nothing.")
@click.option("--force", is_flag=True, help="Take actions already taken for an event again.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@pass_ctx
def replay(c: Ctx, event_ids, since, dry_run, force, as_json):
    """Run the rules again on stored events (by id, and/or --since).

    Idempotent: an action a rule already took for an event (an instance it started, a
    command it applied) is skipped unless --force. Exit 1 for an unknown event id.

    \f
    Raises:
        UserError: neither ids nor ``--since`` (exit 2), an unknown event (exit 1).
    """
    from runner.sensors.replay import event_ids_since
    from runner.sensors.replay import replay as run_replay

    ids = list(event_ids)
    if since is not None:
        ids += event_ids_since(c.engine, _since(since))
    if not ids and since is None:
        raise UserError("events replay: give event ids or --since TIME", 2)
    results = run_replay(c.engine, c.registry(), ids, dry_run=dry_run, force=force)
    if as_json:
        out = [
            {
                "event": r.event_id,
                "sensor": r.sensor,
                "payload": r.payload,
                "note": r.note,
                "rules": [v.as_json() for v in r.rules],
            }
            for r in results
        ]
        click.echo(json.dumps(out, indent=2))
        return
    if not results:
        click.echo("no event to replay")
    for r in results:
        mode = " (dry run: nothing written)" if dry_run else ""
        click.echo(f"event {r.event_id} of {literal(r.sensor)}{mode}: {json.dumps(r.payload)}")
        if r.note:
            click.echo(f"  {literal(r.note)}")
        for line in _verdict_lines(r.rules, replaying=True, force=force):
            click.echo(literal(line))


@click.group(name="rules")
def rules_group():
    """Try a flow's rules on an event (writes nothing)."""


@rules_group.command(name="test")
@click.argument("flow")
@click.option("--sensor", required=True, help="The sensor's name in the flow.")
@click.option("--event", "event_json", metavar="JSON", help="The event's fields as JSON.")
@click.option("--line", metavar="TEXT", help="A log line (tail sensors).")
@click.option("--path", metavar="PATH", help="A file (files sensors).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@pass_ctx
def rules_test(c: Ctx, flow, sensor, event_json, line, path, as_json):
    """Which rule of FLOW matches an event of --sensor, and what it would do now.

    Prints every rule with why it matches or not, and for the matching ones the action
    with its rendered data (or the instances a command would select). Writes nothing.
    Exit 1 when a matching rule would fail (e.g. the event lacks a field its templates
    name); 2 for an unknown flow or sensor, or an event the sensor would not record.

    \f
    Raises:
        UserError: bad flow, sensor or event (exit 2).
        SystemExit: 1 when a matching rule would fail.
    """
    from runner.sensors.replay import sensor_payload, try_rules

    if sum(x is not None for x in (event_json, line, path)) != 1:
        raise UserError("rules test: give exactly one of --event, --line or --path", 2)
    event = None
    if event_json is not None:
        try:
            event = json.loads(event_json)
        except json.JSONDecodeError as exc:
            raise UserError(f"--event: not valid JSON: {exc}", 2) from None
        if not isinstance(event, dict):
            raise UserError("--event must be a JSON object", 2)
    registry = c.registry()
    compiled = registry.get(flow)
    payload = sensor_payload(compiled, sensor, event=event, line=line, path=path)
    verdicts = try_rules(c.engine, registry, flow, sensor, payload)
    if as_json:
        out = {"flow": flow, "sensor": sensor, "payload": payload}
        out["rules"] = [v.as_json() for v in verdicts]
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(f"event of {flow}.{sensor}: {json.dumps(payload)}")
        for text in _verdict_lines(verdicts, replaying=False):
            click.echo(literal(text))
    if any(v.error for v in verdicts):
        raise SystemExit(1)
