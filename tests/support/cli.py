"""Run the ``flowrun`` command as a real subprocess, for the CLI tests (``tests/system``)."""

from __future__ import annotations

import subprocess
import sys


def flowrun(env: dict, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    """Run ``python -m runner.cli ARGS`` with ``env`` (in ``env["TEST_CWD"]`` when set);
    asserts it printed no traceback and exited ``code``; returns the finished process."""
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=env.get("TEST_CWD"),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc
