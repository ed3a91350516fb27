"""When a daemon's parts start (``runner.service.daemon.serve``): the sensor hub after the
worker's first cycle, once the worker has nothing running or ``HUB_AFTER`` seconds later,
whichever comes first. Real SQLite file, real worker and hub, in-process."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from runner.engine.config import WorkerConfig
from runner.ops import detail
from runner.service import daemon
from runner.service.daemon import serve
from runner.service.startup import load_registry
from runner.store.create import create_instance
from runner.store.db import make_engine

#: The handler waits for the hub's "sensors ready" line (a file the test's log handler
#: writes) and records whether it came while the attempt was still running.
TASKS = """
import asyncio, pathlib

async def wait_for_hub(ctx):
    ready = pathlib.Path(ctx.data["ready"])
    for _ in range(1200):  # 60 s at most: long enough for a loaded machine
        if ready.exists():
            ctx.data["hub_started_while_running"] = True
            return True
        await asyncio.sleep(0.05)
    ctx.data["hub_started_while_running"] = False
    return True
"""


class _ReadyFile(logging.Handler):
    """Writes ``path`` when the sensor hub logs that it is ready."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("sensors ready"):
            self.path.write_text("ready")


@pytest.fixture
def ready_file(tmp_path: Path):
    path = tmp_path / "hub-ready"
    handler = _ReadyFile(path)
    logger = logging.getLogger("flowrun.sensors")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield path
    logger.removeHandler(handler)
    logger.setLevel(level)


def _daemon(tmp_path: Path):
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "hubwait_tasks.py").write_text(TASKS)
    (flows / "h.yaml").write_text(
        "flow: h\ninitial: a\nstates:\n"
        "  a: {call: 'hubwait_tasks:wait_for_hub', next: done}\n"
        "  done: {terminal: true}\n"
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'h.db'}")
    return engine, load_registry(engine, flows)


def test_a_busy_worker_gets_its_hub_within_hub_after(
    tmp_path: Path, ready_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the attempt runs until the hub is ready: the hub must not wait for the worker to
    # have nothing running (it would wait forever), only for HUB_AFTER
    monkeypatch.setattr(daemon, "HUB_AFTER", 0.2)
    engine, registry = _daemon(tmp_path)
    with engine.begin() as conn:
        iid = create_instance(conn, registry.get("h"), {"ready": str(ready_file)})
    cfg = WorkerConfig(exit_when_idle=True, worker_id="busy")
    served = asyncio.run(asyncio.wait_for(serve(engine, registry, cfg, install_signals=False), 120))
    assert served.code == 0
    item = detail.get_instance(engine, iid)
    assert item["status"] == "completed"
    assert item["data"]["hub_started_while_running"] is True


def test_an_idle_worker_starts_its_hub_at_once(
    tmp_path: Path, ready_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nothing to run: the hub starts when the worker is idle, not HUB_AFTER later (an
    # hour here), and --exit-when-idle, which waits for the hub, exits
    monkeypatch.setattr(daemon, "HUB_AFTER", 3600.0)
    engine, registry = _daemon(tmp_path)
    cfg = WorkerConfig(exit_when_idle=True, worker_id="idle")
    served = asyncio.run(asyncio.wait_for(serve(engine, registry, cfg, install_signals=False), 120))
    assert served.code == 0
    assert ready_file.exists(), "the hub started and was ready before the daemon exited"
