"""``flowrun sleep ID... --until T | --for D`` and ``flowrun wake ID...`` (Metafora's Sleep
and Run): an instance sleeps in its state until a time, spending nothing, or wakes now.

Both are commands through ``runner.ops.commands.submit`` (audited rows, a running attempt
cancelled), the same path as the console's ``z``/``w`` keys.
"""

from __future__ import annotations

import click

from runner.cli.context import Ctx, pass_ctx
from runner.cli.operator import report
from runner.errors import UserError


def wake_at(until: str | None, for_: str | None, now: float) -> float:
    """The wake time (epoch seconds, UTC) of ``--until T`` (ISO 8601; no zone means UTC)
    or ``--for D`` (a duration from ``now``). Raises ``UserError(..., 2)`` for neither,
    both, or a malformed value."""
    from runner.control_channel import wake_time
    from runner.durations import parse_duration

    if (until is None) == (for_ is None):
        raise UserError("sleep: give exactly one of --until TIME or --for DURATION", 2)
    try:
        if for_ is not None:
            return now + parse_duration(for_)
        return wake_time(until, now)  # type: ignore[arg-type]  # one of the two is given
    except ValueError as exc:
        raise UserError(f"sleep: {exc}", 2) from None


@click.command(name="sleep")
@click.argument("ids", nargs=-1, type=int, required=True)
@click.option("--until", "until", metavar="TIME", help="ISO 8601 time, e.g. 2026-12-01T09:00Z.")
@click.option("--for", "for_", metavar="DURATION", help="A duration from now: 15m, 4h, 2d.")
@pass_ctx
def sleep_cmd(c: Ctx, ids: tuple[int, ...], until: str | None, for_: str | None):
    """Put instances to sleep in their state until a time (nothing is spent).

    A running attempt is cancelled; the instance is `sleeping` with its due time set and
    a worker runs it again then (`flowrun wake` runs it now). Exit 1 when an instance is
    unknown or refused (finished, or in a state that waits for an event).

    \f
    Raises:
        UserError: neither or both of ``--until``/``--for``, or a bad value (exit 2).
    """
    import time

    from runner.ops.commands import submit

    at = wake_at(until, for_, time.time())
    report(submit(c.engine, ids, "sleep", until=at, source="cli"))


@click.command()
@click.argument("ids", nargs=-1, type=int, required=True)
@pass_ctx
def wake(c: Ctx, ids: tuple[int, ...]):
    """Wake sleeping instances now (a sleep or a backoff ends; exit 1 if not sleeping).

    \f
    Raises:
        ConfigError: the database cannot be opened.
    """
    from runner.ops.commands import submit

    report(submit(c.engine, ids, "wake", source="cli"))


COMMANDS = (sleep_cmd, wake)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
