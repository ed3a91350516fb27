"""The loop's budget for reading handlers' output (``runner.handlers.read_pace``): past
its share of a window the pipes of a fast writer are held until the next window, and
nothing is lost or reordered. Real subprocesses, both spawn paths."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runner.handlers import read_pace
from runner.handlers.read_pace import WINDOW, ReadPace
from runner.log_buffer import END, STDERR, STDOUT, AttemptLog
from tests.unit.handlers.test_exec_log_order import _Kept, run_logged

LINES = 100_000  # 9 bytes each on stdout, 10 on stderr: under the log's head and pending
FAST = f"""
import os
out = b"".join(b"%08d\\n" % i for i in range({LINES}))
err = b"".join(b"e%08d\\n" % i for i in range({LINES}))
for k in range(0, len(err), 4096):
    if k < len(out):
        os.write(1, out[k : k + 4096])
    os.write(2, err[k : k + 4096])
"""


async def test_the_share_of_a_window_is_kept_and_the_held_resume_at_the_next() -> None:
    loop = asyncio.get_running_loop()
    pace = ReadPace(loop)
    assert not pace.over()  # a window begins
    pace.spent(read_pace.SHARE * WINDOW / 2)
    assert not pace.over()
    pace.spent(read_pace.SHARE * WINDOW / 2)
    assert pace.over()
    resumed = asyncio.Event()
    held_at = loop.time()
    pace.later(resumed.set)
    pace.later(lambda: None)  # one timer for every pipe held in a window
    await asyncio.wait_for(resumed.wait(), 5)
    assert loop.time() - held_at <= WINDOW + 1.0  # at the window's end (a loaded loop: late)
    assert not pace.over()  # the new window has its whole share


@pytest.mark.usefixtures("spawn_path")
async def test_a_fast_writer_is_held_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_pace, "SHARE", 0.01)  # held often, whatever the machine's speed
    holds = []
    later = ReadPace.later
    monkeypatch.setattr(ReadPace, "later", lambda self, fn: (holds.append(1), later(self, fn)))
    log = AttemptLog(_Kept(), 1, 1, 8 << 20)
    await run_logged(FAST, tmp_path, log)
    assert holds, "the pipes were read past the loop's share"
    rows, _, _ = log.take()
    kept = {STDOUT: bytearray(), STDERR: bytearray()}
    for _, stream, _, _, data in rows:
        if stream != END:
            kept[stream] += data
    assert kept[STDOUT] == b"".join(b"%08d\n" % i for i in range(LINES))
    assert kept[STDERR] == b"".join(b"e%08d\n" % i for i in range(LINES))
