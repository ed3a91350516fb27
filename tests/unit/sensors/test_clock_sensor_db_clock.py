"""A clock sensor judges its ticks by the database's clock (``runner.store.clock``), as
the sensor's lease: on PostgreSQL the lease moves between hosts, and one whose clock is
off fired a tick up to its skew early or late, and started a fresh sensor's ticks off
its own time.

The engine is SQLite given a clock of its own with a known offset, as
``runner.store.pg_engine.pg_engine`` gives every PostgreSQL engine: the host's clock 90 s ahead
of the database's, or 90 s behind. Every ``every: 60s`` cursor is set on the database's
clock, as another host would have left it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from runner.flowspec.compiler import load_flow
from runner.sensors.clock import ClockSensor
from runner.sensors.events import claim_leases, load_cursor
from runner.store.clock import DbClock, track_server_clock
from runner.store.tables import sensors
from tests.support.sensor_hub import engine_at, rows, wait_until, write_flow

NAME = "clocks.tick"


def _sensor(tmp_path: Path, host_ahead: float, last: float | None) -> tuple[ClockSensor, DbClock]:
    """A ``every: 60s`` sensor holding its lease, its cursor ``last`` seconds from the
    database's now (``None``: no cursor), on an engine whose host is ``host_ahead``."""
    flow = load_flow(write_flow(tmp_path / "flows", "clocks", "sensors:\n  tick: {every: 60s}\n"))
    engine = engine_at(tmp_path)
    clock = track_server_clock(engine, "the test's database")
    clock.offset, clock.error = -host_ahead, 0.0
    assert claim_leases(engine, [NAME], "w", 600.0) == {NAME}
    if last is not None:
        with engine.begin() as conn:
            conn.execute(
                update(sensors)
                .where(sensors.c.name == NAME)
                .values(cursor={"last": clock.now() + last})
            )
    spec = (flow.sensors or {})["tick"]
    return ClockSensor(engine, NAME, flow, spec, "w", lambda: None), clock


def _ticks(sensor: ClockSensor) -> list[dict[str, Any]]:
    return [json.loads(p) for (p,) in rows(sensor.engine, "SELECT payload FROM events")]


@pytest.mark.parametrize(
    ("host_ahead", "last", "fired"),
    [
        (90.0, -30.0, False),  # next tick 30 s ahead by the database: not fired 60 s early
        (-90.0, -70.0, True),  # a tick 10 s past by the database: fired now, not 80 s late
        (90.0, None, False),  # a fresh sensor: its first tick counts from the database's now
    ],
)
async def test_start_up_ticks_by_the_database_clock(
    tmp_path: Path, host_ahead: float, last: float | None, fired: bool
) -> None:
    sensor, clock = _sensor(tmp_path, host_ahead, last)
    stop = asyncio.Event()
    task = asyncio.ensure_future(sensor.run(stop))
    try:
        await asyncio.wait_for(sensor.started.wait(), 60)
        now = clock.now()
        stored = load_cursor(sensor.engine, NAME)["last"]
        ticks = _ticks(sensor)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        sensor.engine.dispose()
    if fired:
        (tick,) = ticks
        assert tick["missed"] and tick["scheduled"] == stored <= now
        assert tick["scheduled"] == pytest.approx(now - 10.0, abs=5.0)
    else:
        assert ticks == []
        if last is None:  # the database's now, not this host's
            assert stored == pytest.approx(now, abs=5.0)
        else:
            assert stored == pytest.approx(now + last, abs=5.0)


async def test_a_tick_is_not_fired_before_its_time_on_the_database_clock(tmp_path: Path) -> None:
    # the next tick 0.5 s ahead by the database, 89.5 s past by this host's clock
    sensor, clock = _sensor(tmp_path, 90.0, -59.5)
    fired_at: list[float] = []
    store = sensor.store

    async def timed_store(rows: Any, cursor: Any = None) -> None:
        if rows:
            fired_at.append(clock.now())
        await store(rows, cursor)

    sensor.store = timed_store  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.ensure_future(sensor.run(stop))
    try:
        await wait_until(lambda: bool(fired_at))
        (tick,) = _ticks(sensor)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        sensor.engine.dispose()
    assert not tick["missed"]
    assert fired_at[0] >= tick["scheduled"]  # not 89.5 s early
