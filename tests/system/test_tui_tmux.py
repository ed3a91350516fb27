"""End to end: the real console in tmux (``flowrun tui --attach``) against a SQLite file
that a daemon in another process works on; keys via ``send-keys``, screen via
``capture-pane``, outcomes read back from the database."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.console_db import build_db, status_of

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

FLOWRUN = [sys.executable, "-m", "runner.cli"]
ROOT = Path(__file__).resolve().parent.parent.parent


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_console_in_tmux_steers_a_daemon(tmp_path: Path):
    engine, db, flows = build_db(tmp_path)
    url = "sqlite:///" + str(db)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    daemon = subprocess.Popen(
        [*FLOWRUN, "--db", url, "--flows", str(flows), "--daemon", "--worker-id", "d1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "daemon.err", "w"),  # noqa: SIM115
    )
    session = f"flowrun-test-{uuid.uuid4().hex[:8]}"
    console = " ".join([*FLOWRUN, "--db", url, "--flows", str(flows), "tui", "--attach"])
    try:
        tmux(
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "160",
            "-y",
            "40",
            "-c",
            str(tmp_path),
            "-e",
            f"PYTHONPATH={ROOT}",
            console,
        )

        def screen() -> str:
            return tmux("capture-pane", "-p", "-t", session)

        wait_for(lambda: "instances" in screen() and "orders" in screen(), what="first paint")
        # the daemon drives runnable instances: 8 (reports/build) completes
        wait_for(lambda: status_of(engine, 8)[0] == "completed", what="the daemon working")
        wait_for(lambda: "completed" in screen().splitlines()[11], what="row 8 repainted")

        # row 3 is paused: down twice, p resumes it; the daemon then moves it on to `check`
        tmux("send-keys", "-t", session, "Down", "Down")
        time.sleep(0.3)
        tmux("send-keys", "-t", session, "p")
        wait_for(lambda: status_of(engine, 3) == ("runnable", "check"), what="resume + run")
        wait_for(lambda: "paused -> runnable" in screen(), what="the notification")

        # row 11 (paused, external state): kill asks first
        tmux("send-keys", "-t", session, "End")
        time.sleep(0.3)
        tmux("send-keys", "-t", session, "Up", "k")
        wait_for(lambda: "Kill instance 11?" in screen(), what="the confirm dialog")
        tmux("send-keys", "-t", session, "y")
        wait_for(lambda: status_of(engine, 11)[0] == "killed", what="kill")

        # a refusal is shown, nothing changes: retry a completed instance (row 5)
        tmux("send-keys", "-t", session, "Home", "Down", "Down", "Down", "Down", "r")
        wait_for(lambda: "cannot retry: instance 5" in screen(), what="refusal")
        assert status_of(engine, 5)[0] == "completed"

        tmux("send-keys", "-t", session, "q")
        wait_for(
            lambda: (
                session not in subprocess.run(["tmux", "ls"], capture_output=True, text=True).stdout
            ),
            what="the console to quit",
        )
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        daemon.terminate()
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
        engine.dispose()
