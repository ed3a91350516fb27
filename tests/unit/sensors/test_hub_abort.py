"""A cancelled hub (the daemon aborts, or its stop's moment is over) ends at once: it
waits for no database call, so a daemon cut off from its database still exits."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from runner.sensors.hub import SensorHub
from tests.support.sensor_hub import engine_at, registry, wait_until, write_flow

FLOW = """\
sensors:
  tick: {every: 200ms}
rules:
  - when: tick
    start: aborts
"""


async def test_a_cancelled_hub_waits_for_no_database_call(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "aborts", FLOW)
    engine = engine_at(tmp_path)
    hub = SensorHub(engine, registry(flows), "w1", 3.0)
    stop = asyncio.Event()
    task = asyncio.ensure_future(hub.run(stop))
    frozen = threading.Event()  # a database that never answers (a frozen network)
    calls: list[int] = []

    def handle_pending() -> tuple[int, int]:
        calls.append(1)
        frozen.wait(30)
        return 0, 0

    try:
        await asyncio.wait_for(hub.ready.wait(), 30)
        hub.rules.handle_pending = handle_pending  # type: ignore[method-assign]
        hub.kick()
        await wait_until(lambda: bool(calls))  # the rules loop is stuck in a call
        before = len(calls)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=3)
        assert done, "the cancelled hub still waits (a call to a database that never answers)"
        with pytest.raises(asyncio.CancelledError):
            task.result()
        assert len(calls) == before  # no drain of the rules after an abort
    finally:
        frozen.set()
        if not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=30)
        engine.dispose()
