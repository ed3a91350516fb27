"""``flowrun explain ID [--json]``: the timeline and forecast of one instance, as text.

The facts and their text come from ``runner.ops.explain`` and ``runner.ops.explanation``
(pure, over ``runner.ops.detail.instance_rows``), which the console's explain screen
shows too (the console may not import the CLI).
"""

from __future__ import annotations

import json
import time

import click

from runner.cli.context import Ctx, pass_ctx
from runner.errors import UserError


def build(db, instance_id: int, now: float | None = None):
    """The ``Explanation`` of ``instance_id`` read from ``db`` (a
    ``runner.store.reader.Reader`` or an ``Engine``).

    Raises ``UserError(..., 1)`` for an unknown id.
    """
    from runner.ops.detail import instance_rows, stored_facts
    from runner.ops.explain import explain

    rows = instance_rows(db, instance_id)
    if rows is None:
        raise UserError(f"no instance {instance_id}", 1)
    return explain(rows, lambda v: stored_facts(db, v), time.time() if now is None else now)


@click.command()
@click.argument("instance_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_ctx
def explain(c: Ctx, instance_id: int, as_json: bool):
    """Why an instance is where it is, and what happens next.

    A timeline (each attempt, each wait and its cause: try_interval, backoff and its
    jitter range, lease expiry, commands; the error budget spent and refilled; restarts;
    rule actions; version changes) and a forecast (when it is due and why, what the next
    error or a missed keepalive would do). Exit 1 for an unknown id.

    \f
    Raises:
        UserError: no such instance (exit 1).
        ConfigError: the database cannot be opened.
    """
    from runner.ops.views import iso

    now = time.time()
    result = build(c.reader, instance_id, now)
    if as_json:
        click.echo(json.dumps(result.as_json(iso), indent=2, default=str))
        return
    from runner.ops.explanation import render_text

    click.echo(render_text(result, now))


COMMANDS = (explain,)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
