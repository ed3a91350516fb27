"""An ``exec`` handler's stdout and stderr keep their order from its first millisecond:
with a log, both pipes are read as data comes from the start (issue 29), not from
``READ_AFTER`` on. Real subprocesses, both spawn paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runner.handlers import supervised
from runner.handlers.attempt import Cancel, Limits
from runner.handlers.environ import handler_env
from runner.handlers.exec_handler import run_exec
from runner.log_buffer import END, STDERR, STDOUT, AttemptLog

# each line is written once the previous one was read (the pipe is empty again), for at
# most 10 s: kept in order only if the daemon reads each pipe as data comes
SCRIPT = """
import fcntl, os, struct, sys, termios, time
def unread(fd):
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\\0" * 4))[0]
for i in range(10):
    for fd, name in ((1, "out"), (2, "err")):
        os.write(fd, f"{name} {i}\\n".encode())
        deadline = time.monotonic() + 10
        while unread(fd) and time.monotonic() < deadline:
            time.sleep(0.001)
"""


class _Kept:
    """A writer that keeps what it is given (no database)."""

    def __init__(self) -> None:
        self.logs: list[AttemptLog] = []

    def queue(self, item: AttemptLog) -> None:
        self.logs.append(item)


async def run_logged(script: str, tmp_path: Path, log: AttemptLog) -> None:
    """Run ``python -c script`` as an ``exec`` handler into ``log``; it must succeed."""
    result = await run_exec(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=handler_env("f", "s", 1, 1, tmp_path),
        data={},
        limits=Limits(timeout=120, keepalive=None, kill_grace=2.0),
        cancel=Cancel(),
        checkpoint=lambda data, values: True,
        next_state="done",
        log=log,
    )
    assert result.outcome == "moved", result.error


@pytest.mark.usefixtures("spawn_path")
async def test_interleaved_writes_from_the_first_millisecond_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the pipes are not looked at before the exit but for the log's own reading
    monkeypatch.setattr(supervised, "READ_AFTER", 3600.0)
    log = AttemptLog(_Kept(), 1, 1, 1 << 20)
    await run_logged(SCRIPT, tmp_path, log)
    rows, _, _ = log.take()
    names = {STDOUT: "out", STDERR: "err"}
    lines = [
        (names[stream], line)
        for _, stream, _, _, data in rows
        if stream != END
        for line in bytes(data).decode().splitlines()
    ]
    want = [(n, f"{n} {i}") for i in range(10) for n in ("out", "err")]
    assert lines == want
