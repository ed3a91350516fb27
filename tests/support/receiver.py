"""A real HTTP receiver for the alert tests: stdlib ``http.server`` on 127.0.0.1 in a
thread of the test process, recording every request; its answers can be scripted."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    """One request: method, path, headers (dict), body (bytes)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        """The body as JSON."""
        return json.loads(self.body)


@dataclass
class Receiver:
    """The requests answered 2xx so far (``requests``) and every request (``tries``);
    ``answer(request) -> (status, headers)`` decides the response (default 200)."""

    port: int = 0
    requests: list[Received] = field(default_factory=list)  # answered 2xx
    tries: int = 0  # every request, whatever the answer
    answer: Callable[[Received], tuple[int, dict[str, str]]] = lambda r: (200, {})
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def got(self) -> list[Received]:
        """A copy of the requests received."""
        with self.lock:
            return list(self.requests)


@contextmanager
def receiving(port: int = 0, receiver: Receiver | None = None) -> Iterator[Receiver]:
    """Serve a :class:`Receiver` on 127.0.0.1:``port`` (0: a free one) until the block ends."""
    rec = receiver or Receiver()

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            got = Received(self.command, self.path, dict(self.headers), self.rfile.read(length))
            status, headers = rec.answer(got)
            with rec.lock:
                rec.tries += 1
                if 200 <= status < 300:
                    rec.requests.append(got)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_GET = do_PATCH = _any

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    rec.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
