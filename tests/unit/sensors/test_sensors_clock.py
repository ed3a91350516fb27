"""Clock sensors: ticks, and missed ticks firing once on start-up."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import insert

from runner.store.tables import sensors
from tests.support.sensor_hub import (
    engine_at,
    rows,
    running_hub,
    scalar,
    settled,
    wait_until,
    write_flow,
)

CLOCK_FLOW = """\
sensors:
  tick: {every: 200ms}
  nightly: {cron: "0 3 * * *"}
rules:
  - when: tick
    start: clocks
    data: {tick: "{event.tick}"}
  - when: nightly
    start: clocks
    data: {tick: "{event.tick}"}
"""


async def test_every_ticks_and_missed_ticks_fire_once(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "clocks", CLOCK_FLOW)
    engine = engine_at(tmp_path)
    now = time.time()
    with engine.begin() as conn:  # as if the daemon had been down for days
        conn.execute(
            insert(sensors),
            [
                {"name": "clocks.tick", "cursor": {"last": now - 3600}, "updated_at": now},
                {"name": "clocks.nightly", "cursor": {"last": now - 5 * 86400}, "updated_at": now},
            ],
        )
    async with running_hub(engine, flows) as hub:
        # ready means the missed ticks are stored: one each, not 18000 and 5
        missed = [json.loads(p) for (p,) in rows(engine, "SELECT payload FROM events")]
        assert sorted(p["missed"] for p in missed) == [True, True]
        assert scalar(engine, "SELECT count(*) FROM events WHERE sensor='clocks.nightly'") == 1
        await wait_until(
            lambda: scalar(engine, "SELECT count(*) FROM events WHERE sensor='clocks.tick'") >= 4
        )
        await settled(hub)
    ticks = [
        json.loads(p)
        for (p,) in rows(
            engine, "SELECT payload FROM events WHERE sensor='clocks.tick' ORDER BY id"
        )
    ]
    assert ticks[0]["missed"] and not any(t["missed"] for t in ticks[1:])
    keys = [k for (k,) in rows(engine, "SELECT key FROM events")]
    assert len(keys) == len(set(keys))
    assert scalar(engine, "SELECT count(*) FROM instances") == len(keys)
    nightly = json.loads(
        rows(engine, "SELECT payload FROM events WHERE sensor='clocks.nightly'")[0][0]
    )
    assert nightly["scheduled"] > now - 86400  # the latest missed 03:00, not the first


async def test_first_start_fires_nothing_until_the_first_tick(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "clocks", CLOCK_FLOW)
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows):
        assert scalar(engine, "SELECT count(*) FROM events") == 0
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM events") >= 1)
