"""How the sensor hub keeps its parts running: the ``keep`` contract and its default.

The daemon passes its supervisor's ``keep`` (``runner.service.supervisor.Supervisor.keep``:
restarts with backoff, gives up after too many failures); without one (tests, tools),
:func:`keep_retrying` restarts a failed part a second later, for ever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import DBAPIError

from runner.sensors.base import first_of, log
from runner.store.db_errors import short_error

#: ``keep(name, run, stop)``: runs the coroutine function ``run`` until it returns or
#: ``stop`` is set, restarting it when it fails (``runner.service.supervisor``).
Keep = Callable[[str, Callable[[], Awaitable[object]], asyncio.Event], Awaitable[None]]


async def keep_retrying(
    name: str, run: Callable[[], Awaitable[object]], stop: asyncio.Event
) -> None:
    """The default ``keep`` without a supervisor: restart ``run`` a second after a
    failure (one log line), until it returns or ``stop`` is set."""
    while True:
        try:
            await run()
            return
        except DBAPIError as exc:
            log.warning("%s: database unavailable (%s); restarting it", name, short_error(exc))
        except Exception:
            log.exception("%s failed; restarting it", name)
        if stop.is_set():
            return
        await first_of(stop.wait(), timeout=1.0)
