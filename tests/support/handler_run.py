"""Run a program as flowrun runs an ``exec`` handler: outside flowrun's own variables,
with a real control pipe whose write end is named by ``FLOWRUN_CONTROL_FD``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from runner.control_channel import ENV


def run_with_control(
    argv: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``argv`` in ``cwd`` with this environment minus its ``FLOWRUN_*`` variables,
    plus ``env`` and the control pipe; ``stdin`` as its input (else none). Returns the
    finished process (text output) and the control lines it wrote. Times out after 120 s
    (``subprocess.TimeoutExpired``)."""
    read_end, write_end = os.pipe()
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    try:
        result = subprocess.run(
            argv,
            cwd=cwd,
            env={**base, **env, ENV: str(write_end)},
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            pass_fds=(write_end,),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as channel:
        return result, channel.read().splitlines()
