"""Two hubs on one database: each sensor runs in one of them, each event is acted on once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.sensor_hub import engine_at, running_hub, scalar, settled, wait_until, write_flow

FLOW = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt", settle: 50ms}}
  tick: {every: 100ms}
rules:
  - when: inbox
    start: multi
    data: {path: "{event.path}"}
  - when: tick
    start: multi
    data: {path: "{event.tick}"}
"""


async def test_two_hubs_each_event_once(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "multi", FLOW)
    inbox = flows / "inbox"
    inbox.mkdir()
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows, "a", lease=1.5) as a:
        async with running_hub(engine, flows, "b", lease=1.5) as b:
            held = a.running() + b.running()
            assert sorted(held) == ["multi.inbox", "multi.tick"]
            for i in range(400):
                (inbox / f"f{i}.txt").write_text(str(i))
                if i % 50 == 0:
                    await asyncio.sleep(0.01)
            await wait_until(
                lambda: (
                    scalar(engine, "SELECT count(*) FROM events WHERE sensor='multi.inbox'") == 400
                )
            )
            await settled(a)
            await settled(b)
        # b stopped and released its leases: a takes over what b ran
        await wait_until(lambda: sorted(a.running()) == ["multi.inbox", "multi.tick"], 20)
        (inbox / "late.txt").write_text("late")
        await wait_until(
            lambda: scalar(engine, "SELECT count(*) FROM events WHERE sensor='multi.inbox'") == 401
        )
        await settled(a)
    assert scalar(engine, "SELECT count(*) FROM events WHERE handled_at IS NULL") == 0
    assert scalar(engine, "SELECT count(*) FROM instances") == scalar(
        engine, "SELECT count(*) FROM events"
    )
    assert scalar(engine, "SELECT count(DISTINCT event_id) FROM instances") == scalar(
        engine, "SELECT count(*) FROM instances"
    )
