"""Helpers shared by the sensor tests (real folders, real SQLite files, real watchers)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from sqlalchemy import Engine, text

from runner.flowspec.registry import FlowRegistry
from runner.sensors.hub import SensorHub
from runner.store.db import make_engine

NOOP_STATES = """\
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""


def write_flow(folder: Path, name: str, body: str) -> Path:
    """Write ``flows/<name>.yaml`` (a no-op graph plus ``body``: sensors and rules)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(f"flow: {name}\n{NOOP_STATES}{body}")
    return path


def engine_at(tmp: Path) -> Engine:
    return make_engine(f"sqlite:///{tmp / 'flowrun.db'}")


def registry(flows: Path) -> FlowRegistry:
    reg = FlowRegistry(flows)
    errors = reg.load_all()
    assert not errors, errors
    return reg


def scalar(engine: Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def rows(engine: Engine, sql: str, **params: object) -> list:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params))


async def wait_until(pred: Callable[[], bool], timeout: float = 30.0, every: float = 0.05) -> None:
    """Poll ``pred`` until true; fail after ``timeout`` seconds (generous, never timed)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def running_hub(
    engine: Engine, flows: Path, worker: str = "w1", lease: float = 3.0, **kw: object
) -> AsyncIterator[SensorHub]:
    """A hub running in this event loop until the block ends (stopped cleanly)."""
    hub = SensorHub(engine, registry(flows), worker, lease, **kw)
    stop = asyncio.Event()
    task = asyncio.ensure_future(hub.run(stop))
    try:
        await asyncio.wait_for(hub.ready.wait(), 30)
        yield hub
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def settled(hub: SensorHub, timeout: float = 30.0) -> None:
    """Wait until the hub has nothing settling and no event is unhandled."""
    await wait_until(lambda: not hub.pending(), timeout)
