"""A real ``flowrun serve`` process for the serve tests: started on a free port, its
stderr in a log file, stopped with SIGINT; and the processes it spawned, read from /proc.
"""

from __future__ import annotations

import re
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.fault import Flowrun, poll

#: A flow whose instances wait in ``wait`` for an event (one shows in the console).
FLOW = """\
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""

#: A token long enough for ``--token`` (16 characters or more).
TOKEN = "t0ken-for-the-test"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status(url: str, context: ssl.SSLContext | None = None, **headers: str) -> int:
    """The HTTP status of a GET (0 when nothing answers)."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@dataclass
class Served:
    """A running ``flowrun serve``: its process, base URL (``http://127.0.0.1:PORT``),
    port and log file (its stdout and stderr)."""

    proc: subprocess.Popen
    base: str
    port: int
    log: Path

    def text(self) -> str:
        """What the server wrote so far."""
        return self.log.read_text(errors="replace")

    def consoles(self) -> list[int]:
        """The pids of the console processes (``flowrun ... tui``) it spawned, living."""
        return [p for p in descendants(self.proc.pid) if b"tui" in cmdline(p).split(b"\0")]


@contextmanager
def serving(
    fr: Flowrun,
    *args: str,
    token: str | None = TOKEN,
    scheme: str = "http",
    ready: int = 401,
    options: tuple[str, ...] = (),
) -> Iterator[Served]:
    """Run ``flowrun OPTIONS serve ARGS`` (``--token token`` unless ``None``; ``options``
    global ones) until the block ends; ready once ``/`` answers ``ready`` (a TLS server:
    any answer)."""
    port = free_port()
    log = fr.home / f"serve-{port}.log"
    handle = log.open("wb")
    given = ["--token", token] if token is not None else []
    proc = subprocess.Popen(
        fr.argv(*options, "serve", "--port", str(port), *given, *args),
        cwd=fr.home,
        env=fr.env,
        stdout=handle,
        stderr=handle,
    )
    served = Served(proc, f"{scheme}://127.0.0.1:{port}", port, log)
    try:
        if scheme == "http":
            poll(lambda: status(served.base + "/") == ready, 60, what="serve listening")
        else:
            poll(lambda: "serving the console" in served.text(), 60, what="serve listening")
        yield served
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        handle.close()


def printed_token(served: Served) -> str:
    """The token in the URL ``flowrun serve`` printed at start."""
    found = re.search(r"\?token=([A-Za-z0-9_-]+)", served.text())
    assert found, served.text()
    return found.group(1)


def cmdline(pid: int) -> bytes:
    """``/proc/PID/cmdline`` (arguments separated by NUL), empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def descendants(pid: int) -> list[int]:
    """The living (not zombie) processes below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
