"""An ``exec`` handler's output is redacted as it is read, before its tail is cut: a
secret split across writes, or cut by the tail's start, leaves no fragment behind. Real
subprocesses, both spawn paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runner.handlers.attempt import TAIL, Cancel, Limits
from runner.handlers.environ import handler_env
from runner.handlers.exec_handler import run_exec

SECRET = "s3cr3t-Zq8vTXw1"

# the secret in two writes (two reads), then so much that the kept tail starts inside
# where the secret was: without redaction as it is read, its last bytes would be kept
SCRIPT = f"""
import os, sys, time
s = os.environ["API_KEY"]
sys.stderr.write("first " + s[:5]); sys.stderr.flush()
time.sleep(0.2)
sys.stderr.write(s[5:] + "\\n" + "-" * 50 + s); sys.stderr.flush()
time.sleep(0.2)
sys.stderr.write("y" * ({TAIL} - 6)); sys.stderr.flush()
print("checkpoint " + '{{"k": "' + s + '"}}', file=open(int(os.environ["FLOWRUN_CONTROL_FD"]), "w"))
sys.exit(2)
"""


@pytest.mark.usefixtures("spawn_path")
async def test_the_kept_tail_and_checkpoints_have_no_fragment(tmp_path: Path) -> None:
    env = handler_env("f", "s", 1, 1, tmp_path)
    env["API_KEY"] = SECRET
    stored: list[dict] = []
    result = await run_exec(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        data={},
        limits=Limits(timeout=60, keepalive=None, kill_grace=2.0),
        cancel=Cancel(),
        checkpoint=lambda data, values: stored.append(values) or True,
        next_state=None,
        secrets=(SECRET.encode(),),
    )
    assert result.outcome == "error"
    assert result.error.startswith("exit code 2: ")
    for fragment in (SECRET, SECRET[-6:], SECRET[:6]):
        assert fragment not in result.error
    assert stored == [{"k": "***"}]
