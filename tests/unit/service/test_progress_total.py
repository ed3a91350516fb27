"""The progress line's total is every instance the daemon runs: its baseline (what was
final already) is counted before the worker's first claim, so instances its first cycles
finish, before the progress line starts, still count (a run of 50,000 quick instances
once ended at "49984/49984"). A real daemon on a real SQLite file; the progress line is
made to start once every instance is final, the latest it can start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from runner.engine.config import WorkerConfig
from runner.flowspec.compiler import load_flow
from runner.flowspec.registry import FlowRegistry
from runner.ops.queries import count_by_status
from runner.service import progress
from runner.service.daemon import serve
from runner.service.options import ServiceOptions
from runner.store.create import create_instances
from runner.store.db import make_engine

FLOW = 'flow: quick\ninitial: work\nstates:\n  work: {exec: ["true"], next: done}\n'
FLOW += "  done: {terminal: true}\n"
INSTANCES = 40


async def test_instances_finished_before_the_progress_line_starts_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "quick.yaml").write_text(FLOW)
    registry = FlowRegistry(flows)
    assert not registry.load_all()
    engine = make_engine(f"sqlite:///{tmp_path / 'f.db'}")
    with engine.begin() as conn:
        create_instances(
            conn, load_flow(flows / "quick.yaml"), [{"i": i} for i in range(INSTANCES)]
        )
    given: list[Any] = []

    async def late_progress(engine: Any, stop: asyncio.Event, **kw: Any) -> None:
        given.append(kw.get("base"))  # what the daemon hands the progress line
        await stop.wait()

    monkeypatch.setattr(progress, "progress_loop", late_progress)
    config = WorkerConfig(worker_id="w", lease=5, exit_when_idle=True)
    options = ServiceOptions(progress=True, tty=False)
    served = await asyncio.wait_for(
        serve(engine, registry, config, install_signals=False, sensors=False, options=options),
        120,
    )
    assert served.code == 0
    now = count_by_status(engine)
    assert now["completed"] == sum(now.values()) == INSTANCES
    # the line counts from the baseline it was given (None: from its own start, when
    # every instance was final already)
    (base,) = given
    line = progress.Progress(base if base is not None else now, 0.0)
    line.update(now)
    assert (line.done, line.total) == (INSTANCES, INSTANCES)
