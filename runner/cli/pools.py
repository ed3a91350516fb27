"""``flowrun pool ls [--json] | set NAME SLOTS | reset NAME``: the pools shared by every
daemon (``runner.ops.pools``)."""

from __future__ import annotations

import json

import click

from runner.cli.context import Ctx, pass_ctx


@click.group(name="pool")
def pool_group():
    """Pools: named slot counts shared by every daemon (see `pools:` in a flow file); a
    flow's `max_running` is listed as pool `flow:FLOW` (`flow:FLOW:KEY` with a key)."""


@pool_group.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON array of pools.")
@pass_ctx
def ls_cmd(c: Ctx, as_json: bool):
    """Pools with their slots, slots in use, by which instances, and how many wait.

    \f
    Raises:
        ConfigError: the database cannot be opened.
    """
    from runner.ops.pools import read_pools

    rows = [] if c.nothing_to_list() else read_pools(c.reader)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from runner.cli.render import pools_table

    pools_table(rows)


@pool_group.command(name="set")
@click.argument("name")
@click.argument("slots", type=click.IntRange(min=0))
@pass_ctx
def set_cmd(c: Ctx, name: str, slots: int):
    """Set pool NAME to SLOTS slots now, on every daemon, without a restart (0 holds
    every new attempt; attempts running keep their slots until they end).

    \f
    Raises:
        UserError: an unknown pool (exit 2).
    """
    from runner.literal import literal
    from runner.ops.pools import set_pool

    set_pool(c.engine, name, slots)
    click.echo(f"pool {literal(name)}: {slots} slots")


@pool_group.command(name="reset")
@click.argument("name")
@pass_ctx
def reset_cmd(c: Ctx, name: str):
    """Give pool NAME back the size its flow files declare.

    \f
    Raises:
        UserError: an unknown pool (exit 2).
    """
    from runner.literal import literal
    from runner.ops.pools import pool_of, set_pool

    set_pool(c.engine, name, None)
    now = pool_of(c.engine, name)
    click.echo(f"pool {literal(name)}: {now['slots'] if now else '?'} slots (as declared)")


COMMANDS = (pool_group,)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
