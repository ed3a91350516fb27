"""``--concurrency`` by default: 16 attempts per core the process may run on, at most 256
(``runner.engine.config.default_concurrency``), for the daemon and the console alike; an
explicit value or ``FLOWRUN_CONCURRENCY`` still wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.engine.config import CONCURRENCY_MAX, PER_CORE, WorkerConfig, default_concurrency

ROOT = Path(__file__).resolve().parents[3]


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def test_the_default_is_per_core() -> None:
    want = min(CONCURRENCY_MAX, PER_CORE * _cores())
    assert default_concurrency() == want
    assert WorkerConfig().concurrency == want
    assert WorkerConfig(concurrency=3).concurrency == 3


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux")
def test_it_follows_the_cpu_affinity() -> None:
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]});"
        "from runner.engine.config import default_concurrency; print(default_concurrency())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(PER_CORE)


def _daemon_log(tmp_path: Path, *args: str, env: dict | None = None) -> str:
    flows = tmp_path / "flows"
    flows.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "runner.cli", "--flows", str(flows)]
    argv += ["--db", f"sqlite:///{tmp_path / 'f.db'}", *args, "--daemon", "--exit-when-idle"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    res = subprocess.run(
        argv, cwd=ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stderr


def test_a_daemon_given_nothing_runs_the_default(tmp_path: Path) -> None:
    log = _daemon_log(tmp_path)
    assert f"(concurrency {default_concurrency()}," in log, log[-2000:]
    assert "(concurrency 5," in _daemon_log(tmp_path, "--concurrency", "5")
    assert "(concurrency 7," in _daemon_log(tmp_path, env={"FLOWRUN_CONCURRENCY": "7"})
