"""What one webhook costs at least (not a test): the CPU a bare HTTP/1.1 POST and its answer
take over a kept loopback connection, against what flowrun's sender takes.

A receiver process (a fork, plain sockets, answers ``200`` with an empty body, parses just
the head and ``Content-Length``) serves one kept connection; this process sends ``--n``
POSTs of a ~300-byte JSON body and reports its own CPU a request (``time.process_time``)
and the receiver's:

1. ``bare``: plain ``socket`` calls, one request then its answer (``sendall``, ``recv``,
   the status read from the first line): the least any Python sender pays a request;
2. ``pipelined K``: K requests in one write, then their K answers;
3. ``flowrun``: ``runner.sensors.http_out.Receivers.send``, the deliverer's own path
   (``http.client`` on a kept connection).

Issue 30's throughput goal leaves ~19 µs of the daemon's CPU an event (0.8× of a no-op
instance's ~75 µs) for storing the event, the rule, the delivery's record and its request:
``docs/performance.md`` § Not done, Alerts.

Usage: ``.venv/bin/python bench/http_floor.py [--n 20000] [--pipeline 16]``
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.sensors.http_out import Receivers  # noqa: E402

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
BODY = (
    b'{"instance": 123456, "flow": "noop", "version": "0123456789abcdef", "state": "done", '
    b'"status": "completed", "kind": "completed", "label": null, "error": "", "attempts": 2, '
    b'"errors": 0, "restarts": 0, "worker": "host:1234", "at": "2026-11-29T10:00:00.000000Z", '
    b'"explain": "completed", "event_id": 98765}'
)


def _serve(listener: socket.socket, report: int) -> None:
    """Answer every request on each accepted connection; write the CPU (µs) a request
    to ``report`` when the client closes."""
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf, n, t0 = b"", 0, time.process_time()
    while data := conn.recv(65536):
        buf += data
        answers = 0
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            answers += 1
        if answers:
            conn.sendall(OK * answers)
            n += answers
    os.write(report, f"{1e6 * (time.process_time() - t0) / max(n, 1):.1f}".encode())


def _receiver() -> tuple[int, int, int]:
    """A receiver process: ``(pid, port, report fd)``."""
    listener = socket.create_server(("127.0.0.1", 0))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the receiver
        os.close(r)
        try:
            _serve(listener, w)
        finally:
            os._exit(0)
    os.close(w)
    port = listener.getsockname()[1]
    listener.close()
    return pid, port, r


def _request(port: int, n: int) -> bytes:
    return (
        b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Idempotency-Key: %d\r\nContent-Length: %d\r\n\r\n" % (port, n, len(BODY))
    ) + BODY


def bare(n: int, batch: int) -> tuple[float, float]:
    """Sender and receiver CPU (µs) a request, ``batch`` requests a write."""
    pid, port, report = _receiver()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.process_time()
    for first in range(0, n, batch):
        sock.sendall(b"".join(_request(port, k) for k in range(first, first + batch)))
        got = b""
        while got.count(b"HTTP/1.1 ") < batch:
            got += sock.recv(65536)
        assert got[9:12] == b"200"
    sender = 1e6 * (time.process_time() - t0) / n
    sock.close()
    return sender, _finish(pid, report)


def flowrun(n: int) -> tuple[float, float]:
    """Sender and receiver CPU (µs) a request through the deliverer's ``Receivers``."""
    pid, port, report = _receiver()
    out = Receivers()
    url = f"http://127.0.0.1:{port}/hook"
    headers = {"Content-Type": "application/json"}
    t0 = time.process_time()
    for k in range(n):
        answer = out.send(url, "POST", BODY, {**headers, "Idempotency-Key": str(k)}, 10.0)
        assert answer.status == 200
    sender = 1e6 * (time.process_time() - t0) / n
    out.close()
    return sender, _finish(pid, report)


def _finish(pid: int, report: int) -> float:
    os.waitpid(pid, 0)
    with os.fdopen(report) as fh:
        return float(fh.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="requests a case")
    ap.add_argument("--pipeline", type=int, default=16, help="requests a write, pipelined")
    args = ap.parse_args()
    n = args.n - args.n % args.pipeline
    for name, (sender, receiver) in (
        ("bare, one request at a time", bare(n, 1)),
        (f"bare, pipelined {args.pipeline} a write", bare(n, args.pipeline)),
        ("flowrun's sender (http.client, kept connection)", flowrun(n)),
    ):
        print(f"{name}: sender {sender:.1f} µs a request, receiver {receiver:.1f} µs")


if __name__ == "__main__":
    main()
