"""A cheap webhook receiver for the benches (measurement equipment, not flowrun).

The stdlib ``http.server`` costs ~190 µs a request, in the bench's own process, under its
GIL, on the core the daemon's deliveries need too. This one runs in a process of its own
(``multiprocessing``, dying with the bench: ``PR_SET_PDEATHSIG`` and a daemon process) as
an ``asyncio.Protocol`` that parses just enough HTTP/1.1 to count requests: the head up to
the blank line, ``Content-Length`` (no chunked bodies: flowrun sends none), the
``Idempotency-Key``; it answers every request ``200`` with an empty body on the kept
connection (keep-alive, as a real receiver). Each arrival is kept as (``time.time()``,
key, body); ``count`` is live (a shared counter), ``results`` asks the process for them.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class _Hook(asyncio.Protocol):
    def __init__(self, got: list[tuple[float, str, bytes]], counter: Any) -> None:
        self.got, self.counter, self.buf = got, counter, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        answers = 0
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                break
            length, key = 0, ""
            for line in self.buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"idempotency-key":
                    key = value.strip().decode()
            if len(self.buf) < end + 4 + length:
                break
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.got.append((time.time(), key, body))
            answers += 1
        if answers:
            with self.counter.get_lock():
                self.counter.value += answers
            assert self.transport is not None
            self.transport.write(_OK * answers)


def _serve(port: Any, counter: Any, conn: Connection) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the bench
    got: list[tuple[float, str, bytes]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Hook(got, counter), "127.0.0.1", 0)
        port.value = server.sockets[0].getsockname()[1]
        done = asyncio.Event()

        def asked() -> None:
            if conn.recv() == "stop":
                done.set()
            conn.send(got)

        loop.add_reader(conn.fileno(), asked)
        await done.wait()

    asyncio.run(main())


class Receiver:
    """The receiver process: ``url`` to post to, ``count()`` requests so far,
    ``results()`` the arrivals [(time.time(), Idempotency-Key, body)], ``stop()``."""

    def __init__(self) -> None:
        self._port = mp.Value("i", 0)
        self._counter = mp.Value("i", 0)
        self._conn, child = mp.Pipe()
        self._proc = mp.Process(target=_serve, args=(self._port, self._counter, child), daemon=True)
        self._proc.start()
        while not self._port.value:
            time.sleep(0.005)
        self.url = f"http://127.0.0.1:{self._port.value}/hook"

    def count(self) -> int:
        """Requests received so far."""
        return int(self._counter.value)

    def results(self) -> list[tuple[float, str, bytes]]:
        """Every arrival so far: (time.time(), Idempotency-Key, body)."""
        self._conn.send("get")
        return self._conn.recv()

    def stop(self) -> list[tuple[float, str, bytes]]:
        """End the process; its arrivals."""
        self._conn.send("stop")
        got = self._conn.recv()
        self._proc.join(5)
        return got
