"""How a daemon ends, once its worker has: the other parts wound down, the exit code.

Signals follow huey's consumer and Stator's ``runstator`` (``Daemon.on_signal`` only asks
the worker to stop); when the worker's task ends, :func:`wind_down` gives the other parts
a moment, cancels the rest and logs what failed, and :func:`exit_code` says how the
process ends.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import DBAPIError

from runner.store.checked_out import interrupt
from runner.store.db_errors import short_error

log = logging.getLogger("flowrun.daemon")

EXIT_FATAL = 70  # EX_SOFTWARE (sysexits.h): a part could not be kept alive


async def wind_down(
    side: list[asyncio.Future[None]], cut_off: bool, grace_left: float | None = None
) -> None:
    """The worker ended: give the other parts (``side``, their tasks) a moment to end
    (10 s; when ``cut_off``: aborted, or the database does not answer, their statements
    then broken off, what is left of the stop's grace period, ``grace_left`` seconds, at
    most 0.5 s and at least 0.05 s), cancel the rest, log what failed. Raises nothing."""
    # the database does not answer: break off the parts' statements waiting for it,
    # and give them a moment only (their leases expire; events wait for the next start)
    if cut_off:
        interrupt()
    if not side:
        return
    moment = 10.0
    if cut_off:
        moment = 0.5 if grace_left is None else min(0.5, max(0.05, grace_left))
    done, pending = await asyncio.wait(side, timeout=moment)
    for task in pending:
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, DBAPIError):  # an outage at stop is not a bug: one
                # line (leases expire; stored events wait for the next start)
                log.warning("stopping: database unavailable (%s)", short_error(exc))
                continue
            log.error("stopping: %s: %s", type(exc).__name__, exc, exc_info=exc)


def exit_code(fatal: str | None, aborted_by: int | None) -> int:
    """The daemon's exit code: :data:`EXIT_FATAL` when the supervisor gave up on a part
    (``fatal``, its name), else 128 + the signal number of an abort (``aborted_by``),
    else 0 (a clean stop or an idle exit)."""
    if fatal is not None:
        return EXIT_FATAL
    if aborted_by is not None:
        return 128 + aborted_by
    return 0
