"""The deadline watch plans its sleep by the database's clock (``runner.store.clock``),
the clock ``fire_due`` judges deadlines by: on a host 90 s ahead of its PostgreSQL
server, a deadline 2 s away by the database looked due to the host at once, and the
watch looked for it every ``MIN_WAIT`` (20 ms) until the database's clock reached it.

The engine is SQLite given a clock of its own with a known offset, as
``runner.store.pg_engine.pg_engine`` gives every PostgreSQL engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import update

import runner.sensors.deadlines as deadlines
from runner.flowspec.compiler import load_flow
from runner.sensors.deadlines import DeadlineWatch
from runner.store.clock import track_server_clock
from runner.store.create import create_instance
from runner.store.tables import instances
from tests.support.sensor_hub import engine_at, write_flow


@pytest.mark.parametrize("host_ahead", [90.0, -90.0])
async def test_the_watch_sleeps_until_the_deadline_by_the_database_clock(
    tmp_path: Path, host_ahead: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = load_flow(write_flow(tmp_path / "flows", "waits", ""))
    engine = engine_at(tmp_path)
    clock = track_server_clock(engine, "the test's database")
    clock.offset, clock.error = -host_ahead, 0.0
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {})
        conn.execute(
            update(instances).where(instances.c.id == iid).values(deadline_at=clock.now() + 3.0)
        )
    looks: list[float] = []
    real = deadlines.fire_due

    def counted(*args: object) -> list:
        looks.append(clock.now())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(deadlines, "fire_due", counted)
    registry = SimpleNamespace(flows={"waits": SimpleNamespace(has_deadlines=True)})
    watch = DeadlineWatch(engine, registry, "w")
    stop = asyncio.Event()
    task = asyncio.ensure_future(watch.run(stop))
    try:
        await asyncio.sleep(1.5)  # half-way to the deadline by the database's clock
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        engine.dispose()
    # the first look, and a few more at most (a look every LOOK_EVERY, 0.5 s, while a
    # commit of its own changes the file); 20 ms apart, 1.5 s would be ~75 looks
    assert 1 <= len(looks) <= 5, looks
    assert watch.missed == 0
