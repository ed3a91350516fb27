"""Flow hot reload: a valid edit takes over (sensors restarted), an invalid one is logged
with file:line:col and the previous version stays in force."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from runner.sensors.hub import SensorHub
from tests.support.sensor_hub import (
    engine_at,
    registry,
    rows,
    running_hub,
    scalar,
    settled,
    wait_until,
    write_flow,
)

FLOW = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt", settle: 50ms}}
rules:
  - when: inbox
    start: hot
    data: {path: "{event.path}", tag: "TAG"}
"""


def count(engine) -> int:
    return scalar(engine, "SELECT count(*) FROM instances")


async def test_valid_and_invalid_edits(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="flowrun.sensors")
    flows = tmp_path / "flows"
    path = write_flow(flows, "hot", FLOW.replace("TAG", "v1"))
    inbox = flows / "inbox"
    inbox.mkdir()
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        (inbox / "a.txt").write_text("a")
        await wait_until(lambda: count(engine) == 1)
        # valid edit, saved by rename like editors do: new tag, new glob, other folder
        tmp = flows / ".hot.yaml.swp"
        tmp.write_text(path.read_text().replace("v1", "v2").replace("inbox", "drop"))
        tmp.rename(path)
        await wait_until(lambda: hub.registry.flows["hot"].rules[0].data["tag"] == "v2")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM flow_versions") >= 1)
        (flows / "drop").mkdir(exist_ok=True)
        await wait_until(lambda: "hot.drop" in hub.running())
        (flows / "drop" / "b.txt").write_text("b")
        await wait_until(lambda: count(engine) == 2)
        # invalid edit: logged with its position, the v2 definition stays in force
        path.write_text(path.read_text().replace("initial: wait", "initial: [wait"))
        await wait_until(
            lambda: any(
                "hot.yaml:" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
            )
        )
        (flows / "drop" / "c.txt").write_text("c")
        await wait_until(lambda: count(engine) == 3)
        await settled(hub)
    tags = [json.loads(d)["tag"] for (d,) in rows(engine, "SELECT data FROM instances ORDER BY id")]
    assert tags == ["v1", "v2", "v2"]
    versions = {v for (v,) in rows(engine, "SELECT version FROM instances")}
    assert len(versions) == 2
    err = next(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert f"{path}:" in err and err.split(f"{path}:")[1].split(":")[0].isdigit()


async def test_edit_before_the_watcher_starts_is_reloaded(tmp_path: Path) -> None:
    """A flow file edited after the daemon's load but before its watcher exists (the
    first moments of a daemon) is reloaded once the watcher runs."""
    flows = tmp_path / "flows"
    path = write_flow(flows, "hot", FLOW.replace("TAG", "v1"))
    (flows / "inbox").mkdir()
    engine = engine_at(tmp_path)
    reg = registry(flows)
    path.write_text(path.read_text().replace("v1", "v2"))  # no watcher yet: no event
    hub = SensorHub(engine, reg, "w1", 3.0)
    stop = asyncio.Event()
    task = asyncio.ensure_future(hub.run(stop))
    try:
        await wait_until(lambda: reg.flows["hot"].rules[0].data["tag"] == "v2")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
