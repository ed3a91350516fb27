"""One liveness verdict for a worker killed with SIGKILL: ``flowrun workers`` (text),
``flowrun workers --json`` and the console's data layer (``ConsoleData.workers``) all
read ``runner.ops.liveness.read_workers`` and say the same word once its heartbeat is
overdue: a real daemon, a real kill -9, a real SQLite file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runner.store.db import make_engine
from runner.tui.data import ConsoleData
from tests.support.cli import flowrun

FLOW = """\
flow: idle
initial: wait
states:
  wait:
    external: true
    on: {go: done}
  done: {terminal: true}
"""


def _flowrun(env: dict, *args: str) -> str:
    return flowrun(env, *args).stdout


def _verdict(env: dict, worker: str) -> str | None:
    rows = {w["id"]: w for w in json.loads(_flowrun(env, "workers", "--json"))}
    return rows[worker]["verdict"] if worker in rows else None


def _wait_for(env: dict, worker: str, verdict: str, deadline: float) -> None:
    seen = None
    while time.monotonic() < deadline:
        seen = _verdict(env, worker)
        if seen == verdict:
            return
        time.sleep(0.5)
    raise AssertionError(f"worker {worker} never became {verdict!r} (last: {seen!r})")


def test_a_killed_daemon_is_dead_in_text_json_and_console(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "idle.yaml").write_text(FLOW)
    url = f"sqlite:///{tmp_path / 'flowrun.db'}"
    env = {**os.environ, "FLOWRUN_FLOWS": str(flows), "FLOWRUN_DB": url, "FLOWRUN_LEASE": "2"}
    _flowrun(env, "start", "idle")  # something to hold: its lease must lapse too
    daemon = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "--daemon", "--worker-id", "w-doomed"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(env, "w-doomed", "alive", time.monotonic() + 90)
        os.kill(daemon.pid, signal.SIGKILL)
        assert daemon.wait(timeout=30) == -signal.SIGKILL
        # stale heartbeat (3 beats of 2 s) and no lease left: dead, for good
        _wait_for(env, "w-doomed", "dead", time.monotonic() + 120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    text = _flowrun({**env, "COLUMNS": "200"}, "workers")
    [line] = [ln for ln in text.splitlines() if ln.split()[:1] == ["w-doomed"]]
    assert line.split()[-1] == "dead", text
    engine = make_engine(url)
    data = ConsoleData(engine)
    try:
        [row] = [w for w in data.workers() if w["id"] == "w-doomed"]
        assert (row["verdict"], row["alive"]) == ("dead", False)
    finally:
        data.close()
        engine.dispose()
