"""``flowrun prune [--flow F] [--older-than D] [--dry-run] [--json] [--vacuum]``: apply
retention now, by the same rules as the daemon's pruner (``runner.ops.prune``)."""

from __future__ import annotations

import json

import click

from runner.cli.context import Ctx, pass_ctx
from runner.errors import UserError
from runner.retention import parse_window


def _policy_text(c: Ctx) -> str:
    """The ``--retention`` in force, as text."""
    return c.retention.retention.text()


def _older_than(_ctx, _param, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        w = parse_window(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if w is None:
        raise click.BadParameter("'forever' keeps everything: give a duration")
    return w


@click.command()
@click.option("--flow", metavar="F", help="Only this flow's instances, history and versions.")
@click.option(
    "--older-than",
    metavar="D",
    callback=_older_than,
    help="Every terminal instance last changed more than D ago, and the attempts of live "
    "instances older than D (instead of the retention windows).",
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object of counts.")
@click.option(
    "--vacuum",
    is_flag=True,
    help="SQLite: afterwards turn on incremental auto-vacuum of a file made without it "
    "(one VACUUM: rewrites the file, holding the write lock meanwhile). PostgreSQL: "
    "afterwards VACUUM (ANALYZE) every flowrun table (without it, only those autovacuum "
    "leaves alone).",
)
@pass_ctx
def prune(
    c: Ctx,
    flow: str | None,
    older_than: float | None,
    dry_run: bool,
    as_json: bool,
    vacuum: bool,
):
    """Delete what retention lets go, now.

    Terminal instances past their flow's window (the flow file's `retention`, else
    --retention) with their attempts, checkpoints, kept stderr tails and commands; the
    old attempts of live instances; handled events no instance refers to (after
    --event-retention); workers silent for 7 days; flow versions no instance is on.
    Non-terminal and locked instances are never deleted. Prints the rows per kind
    (instances, attempts, checkpoints, logs, commands, events, workers, versions).

    \f
    Raises:
        UserError: an unknown --flow (exit 2).
        FlowErrors: a flow file has errors (exit 2: its retention is unknown).
        ConfigError: the flows folder or the database cannot be opened.
    """
    from runner.ops.prune import prune as run_prune
    from runner.ops.prune import rules_for, text
    from runner.store import prune as store_prune
    from runner.store import space
    from runner.store.dialect import dialect_of

    if c.flows.is_dir():
        loaded = list(c.registry(strict=True).flows.values())
    else:
        loaded = []
        click.echo(
            f"flowrun: no flows folder at {c.flows}: every flow is pruned by --retention "
            f"({_policy_text(c)})",
            err=True,
        )
    opts = c.retention
    rules = rules_for(loaded, opts.retention, events=opts.event_retention, older_than=older_than)
    engine = c.engine
    if flow is not None and flow not in {f.name for f in loaded} | set(
        store_prune.flows_stored(engine)
    ):
        raise UserError(f"unknown flow {flow!r}", 2)
    counts = run_prune(engine, rules, flow=flow, dry_run=dry_run)
    vacuumed = False
    postgres = not dialect_of(engine).in_process
    if not dry_run and postgres:  # autovacuum's job, done where it does not run
        tables = list(space.TABLES) if vacuum else space.unvacuumed(engine)
        vacuumed = bool(space.vacuum_tables(engine, tables))
    elif not dry_run:
        if vacuum:
            vacuumed = space.convert(engine)
        while space.vacuum_step(engine) > 2000:
            pass
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, **counts, "vacuumed": vacuumed}))
        return
    click.echo(text(counts, dry_run=dry_run))
    if vacuumed:
        done = "vacuumed" if postgres else "converted to incremental auto-vacuum"
        click.echo(f"database {done}")


COMMANDS = (prune,)
