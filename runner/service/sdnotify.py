"""systemd's ``sd_notify`` protocol: a few lines over an ``AF_UNIX`` datagram socket.

The service manager passes the socket in ``NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace) and, with ``WatchdogSec=``, the watchdog period in ``WATCHDOG_USEC``
(microseconds; ``WATCHDOG_PID``, when set, names the process meant). Messages are
newline-separated ``KEY=value`` assignments: ``READY=1``, ``STATUS=...``, ``WATCHDOG=1``,
``STOPPING=1``. Source: sd_notify(3) and its reference implementation "sd_notify
without libsystemd" (systemd's own docs); no dependency needed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger("flowrun.systemd")


class Notifier:
    """Sends notifications to ``NOTIFY_SOCKET``; does nothing when it is not set.

    Args:
        env: the environment to read (``os.environ`` when ``None``).

    Attributes:
        enabled: a socket was given.
        watchdog: the watchdog period in seconds, or ``None`` (``WATCHDOG_USEC`` unset, 0,
            or meant for another ``WATCHDOG_PID``).
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self.enabled = bool(path)
        self.watchdog: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self._warned = False

    def send(self, **fields: object) -> bool:
        """Send ``KEY=value`` lines (``send(READY=1, STATUS="...")``); True when sent.

        A failure (the manager's socket gone) is logged once at warning level, never
        raised: notification is a courtesy, not a reason to stop."""
        if not self.enabled:
            return False
        text = "\n".join(f"{k}={v}" for k, v in fields.items())
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(text.encode(), self.address)
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("systemd notify socket %s: %s", self.address.lstrip("\0"), exc)
            return False

    def close(self) -> None:
        """Close the socket (a later :meth:`send` opens a new one)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def notify_loop(
    notifier: Notifier,
    ready: Callable[[], bool],
    healthy: Callable[[], bool],
    status: Callable[[], str],
    stop: asyncio.Event,
    every: float = 5.0,
) -> None:
    """Send ``READY=1`` once ``ready()``, then ``STATUS=status()`` every ``every`` s (at
    most half the watchdog period) and ``WATCHDOG=1`` only while ``healthy()`` and the
    event loop itself keeps time (a turn late by more than half the watchdog period
    sends no ping); ``STOPPING=1`` when ``stop`` is set. Runs until ``stop``."""
    period = every if notifier.watchdog is None else min(every, notifier.watchdog / 2)
    sent_ready = False
    last_status = ""
    try:
        while not stop.is_set():
            before = time.monotonic()
            if not sent_ready and ready():
                sent_ready = notifier.send(READY=1, STATUS=status())
            elif sent_ready:
                text = status()
                if text != last_status:
                    notifier.send(STATUS=text)
                    last_status = text
            if notifier.watchdog is not None and healthy():
                notifier.send(WATCHDOG=1)
            try:
                await asyncio.wait_for(stop.wait(), period if sent_ready else 0.1)
            except TimeoutError:
                pass
            late = time.monotonic() - before - (period if sent_ready else 0.1)
            if notifier.watchdog is not None and late > notifier.watchdog / 2:
                log.warning("event loop stalled for %.1fs", late)
    finally:
        notifier.send(STOPPING=1, STATUS="stopping")
