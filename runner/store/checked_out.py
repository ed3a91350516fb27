"""PostgreSQL connections checked out now, by thread, and what can be done to one from
another thread: see how long it has waited for the server (:func:`server_wait`), or
break off its wait (:func:`interrupt`). Fed by the pool's events
(``runner.store.pg_engine.pg_engine``); used by the worker's per-call time limit
(``runner.engine.db_thread``) and at a stop.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

#: PostgreSQL connections checked out now: ``{id(dbapi connection): (thread id, it)}``
_out: dict[int, tuple[int, Any]] = {}


def checked_out(dbapi_conn: Any) -> None:
    """Record that the calling thread has checked out ``dbapi_conn`` (a psycopg
    connection; the pool's ``checkout`` event)."""
    _out[id(dbapi_conn)] = (threading.get_ident(), dbapi_conn)


def checked_in(dbapi_conn: Any) -> None:
    """Forget ``dbapi_conn``: given back, invalidated or closed."""
    _out.pop(id(dbapi_conn), None)


def interrupt(thread: int | None = None) -> int:
    """Break off every statement waiting on the network: shut down the socket of each
    PostgreSQL connection checked out now by thread ``thread`` (``threading.get_ident()``),
    or by any thread (``None``); returns how many.

    The thread blocked in that connection's socket read gets an error at once
    (``OperationalError``, a lost connection: the pool discards it), whatever the network
    does: a frozen peer that acknowledges but never answers defeats TCP keepalives and
    ``tcp_user_timeout``. Used for the worker's statement timeout
    (``runner.engine.db_thread``) and at a stop. Safe from any thread; a connection
    closed meanwhile is skipped.
    """
    n = 0
    for sock in _sockets(thread):
        try:
            sock.shutdown(socket.SHUT_RDWR)  # acts on the socket, not on this descriptor
        except OSError:
            continue
        n += 1
    return n


def server_wait(thread: int | None) -> float | None:
    """Seconds the PostgreSQL connection checked out by thread ``thread``
    (``threading.get_ident()``) has been waiting for the server: since its last send, if
    the server has sent nothing since; 0 when it has (its answer came, read or not: a
    thread late to read it is starved of CPU, not cut off). From the kernel's own times
    (Linux ``TCP_INFO``: ``tcpi_last_data_sent``, ``tcpi_last_data_recv``). ``None`` when
    it cannot be told (no such thread or connection, a Unix socket, another system).
    With several connections: the longest."""
    if thread is None:
        return None
    longest: float | None = None
    for sock in _sockets(thread):
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        except OSError:  # not TCP, no TCP_INFO
            continue
        if len(info) < _TCP_INFO_SIZE:
            continue
        sent_ago, _, recv_ago = struct.unpack_from("=III", info, _LAST_DATA_SENT)
        waited = 0.0 if recv_ago <= sent_ago else sent_ago / 1000
        longest = waited if longest is None else max(longest, waited)
    return longest


def _sockets(thread: int | None) -> Iterator[socket.socket]:
    """A socket object over a copy of the descriptor of each open connection checked out
    by ``thread`` (any thread: ``None``), closed once the caller moves on; a connection
    closed or lost meanwhile is skipped."""
    for owner, conn in list(_out.values()):
        if thread is not None and owner != thread:
            continue
        try:
            if conn.closed:
                continue
            fd = os.dup(conn.pgconn.socket)
        except Exception:  # noqa: BLE001 - closed or lost meanwhile: nothing to look at
            continue
        with socket.socket(fileno=fd) as sock:
            yield sock


#: ``struct tcp_info`` (``linux/tcp.h``): ``tcpi_last_data_sent``, ``tcpi_last_ack_sent``
#: and ``tcpi_last_data_recv`` (u32 ms ago) from byte 44, after 8 one-byte fields and 9
#: u32 ones; 104 bytes cover them on every Linux since 2.6.
_LAST_DATA_SENT, _TCP_INFO_SIZE = 44, 104
