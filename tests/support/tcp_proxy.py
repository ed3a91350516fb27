"""A small TCP proxy for outage tests: a daemon talks to PostgreSQL through it, and
``cut()`` makes the database vanish for that daemon only (every connection reset, new
ones refused) while the shared server keeps serving the other tests; ``restore()`` ends
the outage."""

from __future__ import annotations

import asyncio
import threading


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (host, port) from a background thread.

    Use as a context manager; ``port`` is the listening port (chosen by the system).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.down = False
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        self._call(self._close_all).result(10)
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _call(self, fn):
        async def run():
            fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def cut(self) -> None:
        """Start an outage: reset every open connection and refuse new ones."""
        self.down = True
        self._call(self._close_all).result(10)

    def restore(self) -> None:
        """End the outage: new connections are forwarded again."""
        self.down = False

    def _close_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()
                self._writers.discard(dst)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
