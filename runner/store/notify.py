"""Wake-ups through the database: PostgreSQL ``LISTEN``/``NOTIFY`` on one channel.

Whatever makes work due (a new instance, a command, an outcome released with a due time)
calls :func:`notify_due` inside the transaction that makes the change, so the notification
is delivered exactly when (and only if) the change commits. Each daemon holds ONE extra
connection that listens (:class:`DueListener`); a notification wakes its worker, which then
looks for due work once. The payload is the earliest ``due_at`` the transaction made (float
seconds since the epoch, UTC), or empty for "due now": a listener whose worker is idle sleeps
until the earliest due time it knows instead of polling.

A notification is lost when the listening connection drops. The listener therefore calls
``on_wake(None)`` after every (re)connection: the worker looks once, then listens again.

On SQLite nothing is sent: the daemons that share one SQLite file are on one host, and the
worker and the sensors in one process wake each other directly (``Worker.wake``).

The idea is pgqueuer's (``LISTEN/NOTIFY`` so idle consumers cost nothing); procrastinate
does the same with a polling fallback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from runner.errors import ConfigError
from runner.store.db import normalize_url, redact
from runner.store.dialect import dialect_of
from runner.store.pg_settings import TCP_SETTINGS

log = logging.getLogger("flowrun.notify")

#: Work is due (payload: the earliest due time, or empty for now): wakes the workers.
CHANNEL = "flowrun_due"
#: A sensor stored an event (no payload): wakes the rule engines.
EVENTS_CHANNEL = "flowrun_events"

#: How often (seconds) a listener waiting for notifications looks whether to stop.
STOP_CHECK = 0.25
#: Seconds between two "cannot connect" lines of one outage (the failures between are
#: counted, not logged).
QUIET = 30.0

_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def notify_due(conn: Connection, due_at: float | None = None) -> None:
    """Tell every listening daemon that work is due (``due_at`` None: now) once ``conn``'s
    transaction commits. A no-op on SQLite.

    Args:
        conn: a connection inside the caller's transaction.
        due_at: the earliest due time the transaction made, seconds since the epoch (UTC);
            ``None`` or a time in the past means "due now".
    """
    if not dialect_of(conn).notify:
        return
    payload = "" if due_at is None or not math.isfinite(due_at) else repr(float(due_at))
    conn.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})


def notify_event(conn: Connection) -> None:
    """Tell every listening daemon's rule engine that an event was stored, once ``conn``'s
    transaction commits. A no-op on SQLite."""
    if dialect_of(conn).notify:
        conn.execute(_NOTIFY, {"channel": EVENTS_CHANNEL, "payload": ""})


def parse_payload(payload: str) -> float | None:
    """The due time a notification carries (seconds since the epoch, UTC), None for now."""
    try:
        value = float(payload) if payload else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def listen_db_url(url: str) -> str:
    """``--listen-db``'s URL checked and in SQLAlchemy's psycopg form (``postgresql://``
    and ``postgres://`` accepted; a ``pooler=`` parameter dropped).

    Raises:
        ConfigError: a URL that does not parse or is not PostgreSQL (one line, password
            redacted).
    """
    try:
        parsed = make_url(normalize_url(url))
    except (ArgumentError, ValueError) as exc:
        raise ConfigError(f"--listen-db {redact(url)!r}: {exc}") from None
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(f"--listen-db {redact(url)!r}: expected a postgresql:// URL")
    return parsed.difference_update_query(["pooler"]).render_as_string(hide_password=False)


def libpq_url(sqlalchemy_url: str) -> str:
    """``postgresql+psycopg://…`` (SQLAlchemy) → ``postgresql://…`` (libpq/psycopg)."""
    scheme, sep, rest = sqlalchemy_url.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}"


class DueListener:
    """One ``LISTEN`` connection that calls ``on_wake(due_at)`` for every notification on
    :data:`CHANNEL` and ``on_event()`` for every one on :data:`EVENTS_CHANNEL`.

    Args:
        url: the database URL (SQLAlchemy form; the password, if any, is used as is).
        on_wake: called on the event loop with the notification's due time (seconds since
            the epoch, UTC) or ``None`` (due now, or "look once": after a (re)connection).
        on_event: called on the event loop when an event was stored (and after a
            (re)connection); ``None``: events are not listened to.
        retry_max: the longest wait between reconnection attempts, in seconds.
        application_name: its name in ``pg_stat_activity`` (unless the URL sets one).

    ``await listener.run(stop)`` listens until ``stop`` is set; connection failures are
    retried with backoff (0.5 s doubling to ``retry_max``) and logged in one line, repeats
    at most every :data:`QUIET` seconds.
    """

    def __init__(
        self,
        url: str,
        on_wake: Callable[[float | None], None],
        on_event: Callable[[], None] | None = None,
        *,
        retry_max: float = 10.0,
        application_name: str = "flowrun listener",
    ) -> None:
        self.url = libpq_url(url)
        self.application_name = application_name[:63]  # NAMEDATALEN - 1
        self.on_wake = on_wake
        self.on_event = on_event
        self.retry_max = retry_max
        self.connected = asyncio.Event()
        self.received = 0
        self.checked = False  # whether it looked for a pooler in between (once)

    async def run(self, stop: asyncio.Event) -> None:
        """Listen until ``stop`` is set. Never raises for a database fault."""
        import psycopg

        failures = 0
        said = 0.0  # time.monotonic() of the last "cannot connect" line
        while not stop.is_set():
            try:
                named = "application_name" in self.url
                tcp: dict[str, Any] = {k: v for k, v in TCP_SETTINGS.items() if k not in self.url}
                name: dict[str, Any] = {} if named else {"application_name": self.application_name}
                conn = await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=5,
                    **tcp,  # a silent network is noticed within seconds
                    **name,
                )
            except psycopg.Error as exc:
                failures += 1
                delay = min(self.retry_max, 0.5 * 2 ** (failures - 1))
                now = time.monotonic()
                if failures == 1 or now - said >= QUIET:  # repeats: at most every QUIET s
                    said = now
                    log.warning(
                        "listener: cannot connect (%s); retrying in %.1fs (%d failures)",
                        _first(exc),
                        delay,
                        failures,
                    )
                await _wait(stop, delay)
                continue
            try:
                if not self.checked:
                    self.checked = True
                    await self._check_direct(conn)
                await conn.execute(f"LISTEN {CHANNEL}")
                if self.on_event is not None:
                    await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                if failures:
                    log.warning("listener: connected again")
                failures = 0
                self.connected.set()
                self.on_wake(None)  # anything sent while we were away: look once
                if self.on_event is not None:
                    self.on_event()
                await self._drain(conn, stop)
            except psycopg.Error as exc:
                failures += 1
                log.warning("listener: connection lost (%s); reconnecting", _first(exc))
            finally:
                self.connected.clear()
                try:
                    await conn.close()
                except Exception:  # noqa: BLE001 - a dead connection may fail to close
                    pass

    async def _check_direct(self, conn) -> None:
        # through a transaction pooler a LISTEN hears nothing once its transaction ends: the
        # server's backend pid differs from the one the pooler announced at login
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        if row is not None and int(row[0]) != conn.info.backend_pid:
            log.warning(
                "listener: its connection goes through a pooler; through a transaction "
                "pooling one notifications are lost (give --listen-db a direct URL)"
            )

    async def _drain(self, conn, stop: asyncio.Event) -> None:
        # ``notifies(timeout=…)`` returns after the timeout with nothing sent to the server,
        # so looking at ``stop`` between waits costs the database nothing.
        while not stop.is_set():
            async for note in conn.notifies(timeout=STOP_CHECK):
                self.received += 1
                if note.channel == EVENTS_CHANNEL:
                    if self.on_event is not None:
                        self.on_event()
                else:
                    self.on_wake(parse_payload(note.payload))
                if stop.is_set():
                    return


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
