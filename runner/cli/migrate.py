"""``flowrun migrate --flow F --to VERSION|latest [--map OLD=NEW ...] [--dry-run] [--wait]
[ID ...]``: move instances to another stored version of their flow
(``runner.ops.migrate``)."""

from __future__ import annotations

import json

import click

from runner.cli.context import Ctx, pass_ctx
from runner.literal import literal


@click.command()
@click.argument("ids", nargs=-1, type=int)
@click.option("--flow", required=True, help="The flow whose instances move.")
@click.option(
    "--to",
    "to",
    required=True,
    metavar="VERSION|latest",
    help="A stored version (hash or unique prefix), or latest: the flows folder's.",
)
@click.option("--map", "pairs", multiple=True, metavar="OLD=NEW", help="Rename a state.")
@click.option("--dry-run", is_flag=True, help="Print what would happen; write nothing.")
@click.option("--wait", is_flag=True, help="Wait for running attempts to end, then migrate.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@pass_ctx
def migrate(c: Ctx, ids, flow, to, pairs, dry_run, wait, as_json):
    """Move instances (IDs, or every unfinished one of --flow) to another version.

    An instance whose current state does not exist in the target is refused and listed
    unless mapped (--map OLD=NEW); one with an attempt running is refused (--wait waits
    for the attempt to end). Each migration is a command row, shown by show and explain.
    Exit 1 when any instance was refused, 2 for bad arguments.

    \f
    Raises:
        UserError: a bad version, map or flow (exit 2); an unknown id (exit 1).
    """
    import time

    from runner.ops.migrate import migrate as run
    from runner.ops.migrate import parse_map, resolve_version
    from runner.store.create import record_version
    from runner.store.db import reading

    mapping = parse_map(pairs)
    latest = None
    if to == "latest":
        loaded = c.registry().get(flow)
        with c.engine.begin() as conn:
            record_version(conn, loaded)
        latest = loaded.version
    with reading(c.engine) as conn:
        target = resolve_version(conn, flow, to, latest)
    kwargs = dict(mapping=mapping, dry_run=dry_run, source="cli")
    results = run(c.engine, flow, target, ids=list(ids) or None, **kwargs)
    while wait and not dry_run and any(r.running for r in results):
        time.sleep(0.5)
        waiting = [r.instance_id for r in results if r.running]
        again = {r.instance_id: r for r in run(c.engine, flow, target, ids=waiting, **kwargs)}
        results = [again.get(r.instance_id, r) for r in results]
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in results], indent=2))
    else:
        if not results:
            click.echo(f"no instance of flow {literal(flow)} to migrate to {literal(target)}")
        for r in results:
            if r.ok:
                click.echo(("would migrate " if dry_run else "") + literal(r.message))
            else:
                click.echo(f"flowrun: {literal(r.message)}", err=True)
    if any(not r.ok and not r.message.endswith("already on version " + target) for r in results):
        raise SystemExit(1)


COMMANDS = (migrate,)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
