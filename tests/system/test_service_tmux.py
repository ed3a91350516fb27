"""In a real terminal (tmux): the ``--exit-when-idle`` progress display, and the console
saying it is stopping while attempts run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from runner.store.db import make_engine
from tests.support.fault import flowrun_cmd, poll

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
    pytest.mark.timeout(240),
]

FLOW = """\
flow: slow
initial: work
states:
  work: {call: "slow_handlers:work", next: done}
  done: {terminal: true}
"""

HANDLERS = """\
import asyncio


async def work(ctx):
    await asyncio.sleep(float(ctx.data.get("sleep", 1)))
    return True
"""


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def _setup(tmp: Path) -> tuple[Path, str, dict[str, str]]:
    flows = tmp / "flows"
    flows.mkdir()
    (flows / "slow.yaml").write_text(FLOW)
    (flows / "slow_handlers.py").write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env["TERM"] = "xterm-256color"
    return flows, f"sqlite:///{tmp / 'f.db'}", env


def _start(flows: Path, url: str, env: dict[str, str], n: int, sleep: float) -> None:
    for _ in range(n):
        res = subprocess.run(
            [*flowrun_cmd(), "--flows", str(flows), "--db", url, "start", "slow", f"sleep={sleep}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr


def _scalar(engine, sql: str) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


class Pane:
    """One tmux session running ``command``; its exit code is printed as ``EXIT=<n>``."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.name = f"flowrun-svc-{uuid.uuid4().hex[:8]}"
        shell = " ".join(command) + "; echo EXIT=$?; sleep 60"
        env_args = [f"{k}={v}" for k, v in env.items() if k in ("PATH", "TERM", "PYTHONPATH")]
        tmux(
            "new-session", "-d", "-s", self.name, "-x", "120", "-y", "30", "-c", str(cwd),
            "env", *env_args, "sh", "-c", shell,
        )  # fmt: skip

    def text(self) -> str:
        return tmux("capture-pane", "-p", "-t", self.name)

    def keys(self, *keys: str) -> None:
        tmux("send-keys", "-t", self.name, *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def test_exit_when_idle_shows_live_progress(tmp_path: Path) -> None:
    flows, url, env = _setup(tmp_path)
    _start(flows, url, env, 12, 1.0)
    daemon = [*flowrun_cmd(), "--flows", str(flows), "--db", url, "--daemon"]
    pane = Pane([*daemon, "--exit-when-idle", "--concurrency", "2"], tmp_path, env)
    try:
        # a live bar: done/total moves while the attempts run, with a rate and an ETA
        first = poll(lambda: re.search(r"\b([1-9]|1[01])/12\b", pane.text()), 90, 0.2)
        assert "ETA" in pane.text() and "/s" in pane.text()
        poll(lambda: re.search(r"\b(\d+)/12\b", pane.text()).group(1) != first.group(1), 60, 0.2)
        poll(lambda: "EXIT=" in pane.text(), 90, what="daemon exit")
        screen = pane.text()
        assert "12/12" in screen and "EXIT=0" in screen, screen
    finally:
        pane.close()


def test_console_says_it_is_stopping(tmp_path: Path) -> None:
    flows, url, env = _setup(tmp_path)
    console = [*flowrun_cmd(), "--flows", str(flows), "--db", url, "--grace", "30", "tui"]
    pane = Pane(console, tmp_path, env)
    try:
        poll(lambda: "flowrun" in pane.text(), 60, what="console up")
        _start(flows, url, env, 1, 120)
        engine = make_engine(url)
        running = "SELECT count(*) FROM instances WHERE running_attempt IS NOT NULL"
        poll(lambda: _scalar(engine, running) == 1, 60, what="attempt running")
        engine.dispose()
        pane.keys("q")
        line = poll(
            lambda: re.search(
                r"stopping: 1 attempts running, up to \d+ s \(q again to abort\)", pane.text()
            ),
            30,
            0.2,
            what="stopping message",
        )
        assert line
        pane.keys("q")  # again: abort now
        poll(lambda: "EXIT=" in pane.text(), 60, what="console exit")
        assert "EXIT=0" in pane.text() and "Traceback" not in pane.text(), pane.text()
    finally:
        pane.close()
