"""Every PostgreSQL engine flowrun opens (:func:`pg_engine`, called by
``runner.store.db.make_engine``): a bounded pool reusing the most recent connection, the
libpq settings (``runner.store.pg_settings``), the server's clock read on each new
connection (``runner.store.clock``), the connections each thread holds
(``runner.store.checked_out``), and a pooled connection pinged inside the caller's own
transaction unless its thread trusts fresh ones (:func:`trust_fresh_connections`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from runner.store.checked_out import checked_in, checked_out
from runner.store.clock import DbClock, track_server_clock
from runner.store.db_errors import short_error
from runner.store.dialect import dialect_of
from runner.store.json_codec import loads_bytes
from runner.store.pg_settings import CONNECT_TIMEOUT, TCP_SETTINGS

#: on a thread that trusts fresh connections, a pooled connection given back less than
#: this many seconds ago is not pinged before use
PING_AFTER = 1.0

_threads = threading.local()


def trust_fresh_connections() -> None:
    """On the calling thread (a worker's database thread), take a pooled PostgreSQL
    connection given back less than :data:`PING_AFTER` s ago without pinging it.

    The ping is a round trip of every cycle; a connection given back a moment ago is alive
    as far as anyone can tell. If the server went away since, the cycle's first statement
    fails, SQLAlchemy drops the pool's connections, and the worker retries the cycle after
    a backoff (``engine.db_thread``), with nothing lost.
    """
    _threads.trust = True


def pg_engine(url: str, *, readonly: bool, pool: int, application_name: str) -> Engine:
    """A PostgreSQL engine holding at most ``pool`` connections (``pool`` >= 1): up to two
    kept open once opened (``engine.pool.size()``: a worker runs two cycles at once on
    them, ``engine.cycle_runner``; reopening one each cycle would cost more than the
    cycle), up to ``pool - 2`` more opened while several threads need one at once and
    closed when returned; a thread finding all in use waits (``pool_timeout``, 30 s). The most
    recently used connection is reused first, and pinged inside the transaction it is
    checked out for.

    Raises ``ArgumentError`` for a bad URL or ``ImportError`` for a missing driver.
    """
    args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT} if "psycopg" in url else {}
    query = make_url(url).query
    if "psycopg" in url:
        args.update({k: v for k, v in TCP_SETTINGS.items() if k not in query})
    if readonly:
        args["options"] = "-c default_transaction_read_only=on"
    if "application_name" not in query:
        args["application_name"] = application_name[:63]  # NAMEDATALEN - 1
    engine = create_engine(
        url,
        pool_size=min(pool, 2),
        max_overflow=max(0, pool - 2),
        pool_use_lifo=True,
        connect_args=args,
        # jsonb values decoded without json.loads' Python layers (the claim reads two
        # per instance); psycopg calls it (SQLAlchemy registers it on its connections)
        json_deserializer=loads_bytes,
    )

    clock = track_server_clock(engine, f"PostgreSQL at {engine.url.host or 'its socket'}")
    clock_sql = f"SELECT {dialect_of(engine).server_clock}"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        read_server_clock(dbapi_conn, clock_sql, clock)

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn, record):  # pragma: no cover - trivial
        checked_in(dbapi_conn)
        record.info["flowrun_used"] = time.monotonic()

    @event.listens_for(engine, "invalidate")
    @event.listens_for(engine, "close")
    def _on_gone(dbapi_conn, *_args):  # pragma: no cover - trivial
        checked_in(dbapi_conn)

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, record, _proxy):
        checked_out(dbapi_conn)
        # A pooled connection may have been dropped by the server meanwhile (a restart,
        # ``idle_session_timeout``, a firewall): ping it, so the pool replaces it instead of
        # failing the caller's first statement. Not SQLAlchemy's ``pool_pre_ping``: that
        # runs the ping in autocommit, a committed transaction of its own on every checkout,
        # which doubled an idle daemon's commits. This ``SELECT 1`` opens the caller's own
        # transaction: the same round trip, no transaction more. A new connection is not
        # pinged, nor, on a thread that trusts fresh connections (the worker's database
        # thread), one given back less than PING_AFTER s ago.
        used = record.info.get("flowrun_used")
        if used is None:
            return
        if getattr(_threads, "trust", False) and time.monotonic() - used < PING_AFTER:
            return
        try:
            cursor = dbapi_conn.cursor()
            try:
                cursor.execute("SELECT 1")  # not autocommit: this begins the caller's transaction
            finally:
                cursor.close()
        except engine.dialect.loaded_dbapi.Error as exc:
            # the pool discards this connection and checks out another (a new one)
            raise DisconnectionError(short_error(exc)) from exc

    return engine


def read_server_clock(dbapi_conn: Any, sql: str, clock: DbClock) -> None:
    """Read the server's clock on a new psycopg connection ``dbapi_conn`` (``sql``: the
    ``SELECT`` of ``Dialect.server_clock``) into ``clock``: one round trip, in autocommit,
    so no transaction is left open."""
    was = dbapi_conn.autocommit
    dbapi_conn.autocommit = True
    try:
        cursor = dbapi_conn.cursor()
        try:
            sent = time.time()
            cursor.execute(sql)
            server = cursor.fetchone()[0]
            received = time.time()
        finally:
            cursor.close()
    finally:
        dbapi_conn.autocommit = was
    clock.observe(float(server), sent, received)
