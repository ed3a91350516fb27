"""The ``flowrun`` operator subcommands: create and inspect instances (``start``, ``ls``,
``show``), command them (``pause``, ``resume``, ``kill``, ``retry``, ``send``) and observe
the runtime (``events``, ``workers``).

Each is a standalone ``click`` command; ``runner.cli.main`` adds them (``COMMANDS``) to the
``flowrun`` group. Commands go through ``runner.ops.commands.submit`` (source ``cli``), the
same path as the console and the rules. A docstring's text after the form feed is not
shown by ``--help``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from runner import lifecycle
from runner.cli.context import Ctx, flow_to_start, pass_ctx
from runner.cli.data import parse_data
from runner.errors import UserError
from runner.literal import literal

if TYPE_CHECKING:  # the database side is imported in the command bodies (fast --help)
    from runner.ops.commands import CommandResult


@click.command()
@click.argument("flow")
@click.argument("pairs", nargs=-1)
@click.option("--data", "data_json", help="Instance data as a JSON object.")
@click.option(
    "--priority",
    type=click.IntRange(1, 9),
    help="1..9 for this instance in every state (default: its states' and flow's, 5).",
)
@pass_ctx
def start(c: Ctx, flow: str, pairs: tuple[str, ...], data_json: str | None, priority: int | None):
    """Create an instance of FLOW (data from --data JSON and key=value pairs); prints its id.

    Data: at most 1 MiB in all, nested at most 64 deep, strict JSON (no NaN). Among due
    instances the higher priority is claimed first, then the earliest due.

    \f
    Raises:
        UserError: bad ``--data`` or pair, data too large or too deep (exit 2; the
            bounds: ``runner.cli.data``), or an unknown flow (exit 2).
        ConfigError: no flows folder, or the database cannot be opened.
    """
    from runner.store.create import create_instance

    data = parse_data(data_json, pairs)
    compiled = flow_to_start(c, flow)  # the last good version when the file has errors
    with c.engine.begin() as conn:
        iid = create_instance(conn, compiled, data, priority=priority)
    click.echo(iid)


@click.command(name="ls")
@click.option("--flow")
@click.option("--status", type=click.Choice(lifecycle.STATUSES))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option(
    "--limit", type=click.IntRange(min=0), default=None, help="Only the newest N (in id order)."
)
@click.option(
    "--search", help="Only those whose label, flow, state, status, error or data contain this."
)
@pass_ctx
def ls_cmd(c: Ctx, flow, status, as_json, limit, search=None):
    """List instances (none, exit 0, when the database does not exist yet).

    \f
    Raises:
        ConfigError: the database cannot be opened.
    """
    from runner.ops.queries import read_instances
    from runner.ops.views import JSON_KEYS, TABLE_KEYS, instance_json

    keys = JSON_KEYS if as_json else TABLE_KEYS
    rows = []
    if not c.nothing_to_list():
        rows = read_instances(
            c.reader,
            keys=keys,
            flow=flow,
            status=status,
            text=search,
            limit=limit,
            desc=limit is not None,
        )
    if limit is not None:
        rows.reverse()
    if as_json:
        from runner.cli.render import json_lines_array

        click.echo(json_lines_array([instance_json(r) for r in rows]))
        return
    from runner.cli.render import instance_table
    from runner.ops.queries import waiting_events

    instance_table(rows, waits=waiting_events(c.reader, rows) if rows else {})


@click.command()
@click.argument("instance_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_ctx
def show(c: Ctx, instance_id: int, as_json: bool):
    """One instance with its attempts, errors, checkpoints and error budget.

    \f
    Raises:
        UserError: no such instance (exit 1).
        ConfigError: the database cannot be opened.
    """
    from runner.ops.detail import get_instance

    item = get_instance(c.reader, instance_id)
    if item is None:
        raise UserError(f"no instance {instance_id}", 1)
    if as_json:
        click.echo(json.dumps(item, indent=2))
        return
    from runner.cli.render import instance_detail

    instance_detail(item)


def _command(c: Ctx, command: str, ids: tuple[int, ...], flow: str | None, event=None) -> None:
    """Apply ``command`` to ``ids`` and/or every instance of ``flow`` it can act on; prints
    one line per instance. Raises ``UserError(..., 2)`` with neither, and
    ``SystemExit(1)`` when any instance refused."""
    from runner import lifecycle
    from runner.ops.commands import select_ids, submit
    from runner.store.db import reading

    if not ids and not flow:
        raise UserError(f"{command}: give instance ids or --flow F", 2)
    id_list = list(ids)
    if flow:  # every instance of the flow this command can act on (no refusal spam)
        with reading(c.engine) as conn:
            id_list += select_ids(conn, flow=flow, status=lifecycle.sources(command))
        if not id_list:
            done = {"pause": "paused", "resume": "resumed", "kill": "killed", "retry": "retried"}
            click.echo(f"no instance of flow '{literal(flow)}' can be {done[command]}")
            return
    report(submit(c.engine, id_list, command, event=event, source="cli"))


def report(results: list[CommandResult]) -> None:
    """Print one line per command result (refusals on stderr); ``SystemExit(1)`` when any
    instance refused the command or was unknown."""

    code = 0
    for r in results:
        if r.ok:
            click.echo(literal(r.message))
        else:
            click.echo(f"flowrun: {literal(r.message)}", err=True)
            code = 1
    if code:
        raise SystemExit(code)


def _make_command(name: str, help_text: str) -> click.Command:
    """A ``click`` command ``name`` (an operator command) taking ids and ``--flow``."""

    @click.argument("ids", nargs=-1, type=int)
    @click.option("--flow", help="Every instance of this flow.")
    @pass_ctx
    def cmd(c: Ctx, ids, flow):
        _command(c, name, ids, flow)

    cmd.__doc__ = help_text
    return click.command(name=name)(cmd)


pause = _make_command("pause", "Pause instances (a running attempt is cancelled).")
resume = _make_command("resume", "Resume paused or sleeping instances.")
kill = _make_command("kill", "Kill instances (a running attempt is cancelled).")
retry = _make_command("retry", "Retry failed instances (the state's counters reset).")


@click.command()
@click.argument("instance_id", type=int)
@click.argument("event")
@pass_ctx
def send(c: Ctx, instance_id: int, event: str):
    """Move an instance along an `on:` edge of its state (exit 2 if not allowed).

    \f
    Exits 1 for an unknown instance; 2 when refused (the message lists the events the
    state accepts, once).

    Raises:
        ConfigError: the database cannot be opened.
    """
    from runner.ops.commands import submit

    results = submit(c.engine, [instance_id], "send", event=event, source="cli")
    r = results[0]
    if r.ok:
        click.echo(literal(r.message))
        return
    # the refusal already names the events the state accepts ("(allowed: ...)")
    click.echo(f"flowrun: {literal(r.message)}", err=True)
    raise SystemExit(1 if r.message.startswith("no instance") else 2)


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--limit", type=int, default=50, show_default=True)
@pass_ctx
def events(c: Ctx, as_json: bool, limit: int):
    """Recent sensor events, what the rules did, and each exec or webhook delivery.

    \f
    Raises:
        ConfigError: the database cannot be opened.
    """
    from runner.ops.queries import list_events

    rows = [] if c.nothing_to_list() else list_events(c.reader, limit=limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from runner.cli.render import events_table

    events_table(rows)


@click.command(name="workers")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def workers_cmd(c: Ctx, as_json: bool):
    """Workers with their heartbeats and running attempts.

    \f
    Raises:
        ConfigError: the database cannot be opened.
    """
    from runner.ops.liveness import list_workers

    rows = [] if c.nothing_to_list() else list_workers(c.reader)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from runner.cli.render import workers_table

    workers_table(rows)


COMMANDS = (start, ls_cmd, show, pause, resume, kill, retry, send, events, workers_cmd)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
