"""A TCP proxy a test can cut and restore: a database outage for one daemon only.

The shared PostgreSQL server must stay up (other tests use it), so a test points its
daemon at this proxy instead and "stops the server" by cutting the proxy: every open
connection is closed and new ones are refused (the listening socket is closed, so a
connect gets ECONNREFUSED exactly as from a stopped server). ``restore()`` listens again
on the same port. ``freeze()`` is the other fault, a network that goes silent: nothing is
forwarded either way and nothing is closed or refused (new connections are accepted and
hang), as behind a hung proxy or a black-holed route; ``thaw()`` forwards what waited.
Runs its own asyncio loop in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (``(host, port)``); see module doc."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.restore()

    @classmethod
    def to_url(cls, url: str) -> tuple[TcpProxy, str]:
        """A proxy to the server of database ``url`` (``scheme://user@host:port/db``) and
        the same URL through it."""
        host_port = url.split("@", 1)[1].split("/", 1)[0]
        host, _, port = host_port.partition(":")
        proxy = cls((host, int(port or 5432)))
        return proxy, url.replace(f"@{host_port}/", f"@127.0.0.1:{proxy.port}/")

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def restore(self) -> None:
        """Listen again (after :meth:`cut`)."""
        self._call(self._listen())

    def cut(self) -> None:
        """Close every connection and stop listening (new connects are refused)."""
        self._call(self._cut())

    def freeze(self) -> None:
        """Stop forwarding, both ways, on every connection, open or new; close nothing."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> None:
        """Forward again (after :meth:`freeze`), what waited first."""
        self._loop.call_soon_threadsafe(self._flowing.set)

    def close(self) -> None:
        """Cut and stop the proxy's loop."""
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._pipe, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_w))

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(copy(reader, up_w), copy(up_r, writer))
        self._writers.difference_update((writer, up_w))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
