"""One supervisor for every long-lived part of ``flowrun --daemon``: nothing half-alive.

Each part (the worker loop, each sensor, the rules, the watcher and flow reload, the
sensor leases, the HTTP listener, the systemd notifier) is a coroutine run through
:meth:`Supervisor.keep`. When it fails:

- an *expected* fault (the database went away, a file-system error: ``DBAPIError``,
  ``OSError``) is one log line without a traceback, and the part is restarted with capped
  exponential backoff (0.25 s doubling to 2 s), for as long as it takes: the part resumes
  when the database is back. Repeats are logged at most every 30 s; "running again" once
  the restarted part has outlived its last run by a few seconds (a part that fails only
  after a while, such as the pruner, is not said to be back at each restart).
- anything else is a bug: logged once with its traceback and restarted the same way, at
  most ``bug_restarts`` times in a row (a run longer than ``healthy_after`` seconds
  clears the count).
- a part that cannot be restarted (declared ``restart=False``, e.g. the worker loop,
  whose running attempts cannot be taken over by a new loop, or a bug that keeps
  recurring) *gives up*: :attr:`Supervisor.fatal` is set, ``on_fatal`` is called (the
  daemon then stops and exits 70, so the service manager restarts it), never a process
  that is up but deaf.

Ideas from Erlang/OTP supervisors (restart intensity) and systemd's ``Restart=`` with
``RestartSec`` backoff, scaled down to coroutines in one process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from runner.store.db_errors import short_error

log = logging.getLogger("flowrun.supervisor")

#: Faults of the environment, not of flowrun: retried forever, logged without traceback.
EXPECTED: tuple[type[BaseException], ...] = (DBAPIError, OSError)


class GiveUp(Exception):
    """Raised by a part that knows it cannot be restarted (the supervisor gives up)."""


@dataclass
class PartState:
    """What the supervisor knows of one part (read by metrics and the status line).

    ``state`` is ``running``, ``retrying`` (failed, waiting to restart), ``done`` or
    ``failed`` (given up); ``failures`` counts failures in a row, ``restarts`` all
    restarts since start; ``last_error`` is the last failure's one-line text."""

    name: str
    state: str = "running"
    failures: int = 0
    restarts: int = 0
    last_error: str = ""
    expected_failures: int = 0


class Supervisor:
    """Keeps the daemon's parts alive.

    Args:
        on_fatal: called once (in the event loop) with the part name when a part cannot be
            kept alive.
        base, cap: first and largest restart delay, seconds.
        bug_restarts: restarts allowed in a row for a part failing with an unexpected
            exception before the supervisor gives up.
        healthy_after: seconds a restarted part must run to clear its failure count.
        quiet_for: seconds between two lines of one part's repeated expected faults.
        back_after: seconds a restarted part must run, beyond its last run's length,
            before it is said to be running again.
    """

    def __init__(
        self,
        on_fatal: Callable[[str], None] | None = None,
        *,
        base: float = 0.25,
        cap: float = 2.0,
        bug_restarts: int = 5,
        healthy_after: float = 30.0,
        quiet_for: float = 30.0,
        back_after: float = 3.0,
    ) -> None:
        self.on_fatal = on_fatal
        self.base, self.cap = base, cap
        self.bug_restarts = bug_restarts
        self.healthy_after = healthy_after
        self.quiet_for = quiet_for
        self.back_after = back_after
        self.parts: dict[str, PartState] = {}
        self.fatal: str | None = None

    def healthy(self) -> bool:
        """True while no part has been given up."""
        return self.fatal is None

    def delay(self, failures: int) -> float:
        """Seconds before restart number ``failures`` (1-based): base doubling to cap."""
        return min(self.cap, self.base * 2 ** max(0, failures - 1))

    async def keep(
        self,
        name: str,
        run: Callable[[], Awaitable[object]],
        stop: asyncio.Event | None = None,
        *,
        restart: bool = True,
    ) -> None:
        """Run ``run()`` until it returns, restarting it on failure (see the module doc).

        ``stop``, when set, ends the retries (a part failing while the daemon stops is
        not restarted). Returns when the part returned normally or ``stop`` is set; returns
        too after giving up (``fatal`` set, ``on_fatal`` called). Cancellation propagates.
        """
        part = self.parts.setdefault(name, PartState(name))
        part.state = "running"
        last_logged = -1e9
        while True:
            started = time.monotonic()
            try:
                await run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the supervisor's whole job
                now = time.monotonic()
                if now - started >= self.healthy_after:
                    part.failures = 0
                part.failures += 1
                expected = isinstance(exc, EXPECTED) and not isinstance(exc, GiveUp)
                text = short_error(exc) if expected else f"{type(exc).__name__}: {exc}"
                part.last_error = text
                if stop is not None and stop.is_set():
                    log.warning("%s: failed while stopping (%s)", name, text)
                    part.state = "done"
                    return
                give_up = (
                    not restart
                    or isinstance(exc, GiveUp)
                    or (not expected and part.failures > self.bug_restarts)
                )
                if give_up:
                    part.state = "failed"
                    if expected or isinstance(exc, GiveUp):
                        log.error(
                            "%s: cannot be kept alive (%s); stopping the daemon",
                            name,
                            text,
                            extra={"part": name},
                        )
                    else:
                        log.error(
                            "%s: cannot be kept alive; stopping the daemon",
                            name,
                            exc_info=exc,
                            extra={"part": name},
                        )
                    self._give_up(name)
                    return
                wait = self.delay(part.failures)
                if expected:
                    part.expected_failures += 1
                    if now - last_logged >= self.quiet_for or part.failures == 1:
                        last_logged = now
                        again = f" ({part.failures} times)" if part.failures > 1 else ""
                        log.warning(
                            "%s: %s%s; restarting in %.2gs",
                            name,
                            text,
                            again,
                            wait,
                            extra={"part": name},
                        )
                else:
                    log.error(
                        "%s failed; restarting in %.2gs",
                        name,
                        wait,
                        exc_info=exc,
                        extra={"part": name},
                    )
                part.state = "retrying"
                if stop is not None:
                    try:
                        await asyncio.wait_for(stop.wait(), wait)
                        part.state = "done"
                        return
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(wait)
                part.restarts += 1
                part.state = "running"
                if part.failures == 1 or now - last_logged < self.quiet_for:
                    self._say_back_later(part, now - started)
            else:
                part.state = "done"
                return

    def _say_back_later(self, part: PartState, ran_for: float) -> None:
        """Log "running again" once a restarted part has survived :attr:`back_after`
        seconds longer than its last run lasted (``ran_for``; at most ``healthy_after``):
        a part that fails only after a while (the pruner, waiting before its first round
        and failing then) has not recovered for having run a few seconds, and saying so
        would start its outage lines over every few seconds."""
        restarts = part.restarts

        def check() -> None:
            if part.restarts == restarts and part.state == "running" and part.failures:
                log.warning("%s: running again", part.name, extra={"part": part.name})
                part.failures = 0

        after = self.back_after + min(ran_for, self.healthy_after)
        asyncio.get_running_loop().call_later(after, check)

    def _give_up(self, name: str) -> None:
        if self.fatal is None:
            self.fatal = name
            if self.on_fatal is not None:
                self.on_fatal(name)
