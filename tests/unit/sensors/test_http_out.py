"""Webhooks out on kept-alive connections (``runner.sensors.http_out``): one connection
for a receiver that keeps it, a new one when the receiver closed it, a 3xx followed."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from runner.sensors.http_out import Receivers


def _serve(keep_alive: bool) -> tuple[ThreadingHTTPServer, list[tuple[int, str]]]:
    """A receiver on 127.0.0.1 recording (client port, path) per request; ``/moved``
    answers 302 to ``/here``."""
    seen: list[tuple[int, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.client_address[1], self.path))
            moved = self.path == "/moved"
            self.send_response(302 if moved else 200)
            if moved:
                self.send_header("Location", "/here")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def _three_posts(keep_alive: bool) -> tuple[list[int], list[tuple[int, str]]]:
    """Three POSTs through one :class:`Receivers`: their statuses, what the receiver saw."""
    server, seen = _serve(keep_alive)
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    rx = Receivers()
    try:
        statuses = [rx.send(url, "POST", b"{}", {}, 5).status for _ in range(3)]
    finally:
        rx.close()
        server.shutdown()
    return statuses, seen


def test_a_keep_alive_receiver_gets_every_request_on_one_connection() -> None:
    statuses, seen = _three_posts(keep_alive=True)
    assert statuses == [200, 200, 200]
    assert len({port for port, _ in seen}) == 1 and len(seen) == 3


def test_a_receiver_closing_each_connection_gets_each_request_once() -> None:
    statuses, seen = _three_posts(keep_alive=False)
    assert statuses == [200, 200, 200]
    assert len(seen) == 3 and len({port for port, _ in seen}) == 3


def test_a_redirect_is_followed_as_urllib_follows_it() -> None:
    server, seen = _serve(keep_alive=True)
    url = f"http://127.0.0.1:{server.server_address[1]}/moved"
    rx = Receivers()
    try:
        answer = rx.send(url, "POST", b"{}", {}, 5)
    finally:
        rx.close()
        server.shutdown()
    assert answer.status == 200
    assert [path for _, path in seen] == ["/moved", "/here"], "the POST is sent once"
