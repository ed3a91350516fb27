"""The tail sensor: whole lines, restarts, rename rotation and copytruncate — no line lost
or doubled."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
from pathlib import Path

from tests.support.sensor_hub import (
    engine_at,
    rows,
    running_hub,
    scalar,
    settled,
    wait_until,
    write_flow,
)

TAIL_FLOW = """\
sensors:
  app: {tail: {path: logs/app.log, from: start, match: 'ERROR (?P<code>\\d+) n=(?P<n>\\d+)'}}
rules:
  - when: app
    match: {code: "^5"}
    start: logs
    data: {n: "{event.n}"}
"""


def setup(tmp_path: Path) -> tuple[Path, Path]:
    flows = tmp_path / "flows"
    write_flow(flows, "logs", TAIL_FLOW)
    log = flows / "logs" / "app.log"
    log.parent.mkdir()
    return flows, log


def append(log: Path, first: int, last: int) -> None:
    """Append lines n=first..last-1: every other one an ERROR 5xx, plus noise lines."""
    with open(log, "a") as f:
        for n in range(first, last):
            f.write(f"ERROR 5{n % 100:02d} n={n}\n" if n % 2 == 0 else f"ERROR 404 n={n}\n")
            f.write("INFO nothing to see\n")


def ns(engine) -> list[int]:
    return sorted(int(json.loads(p)["n"]) for (p,) in rows(engine, "SELECT payload FROM events"))


def started(engine) -> list[int]:
    return sorted(int(json.loads(d)["n"]) for (d,) in rows(engine, "SELECT data FROM instances"))


async def until_events(engine, count: int) -> None:
    await wait_until(lambda: scalar(engine, "SELECT count(*) FROM events") >= count)


async def test_lines_fields_and_partial_line(tmp_path: Path) -> None:
    flows, log = setup(tmp_path)
    engine = engine_at(tmp_path)
    append(log, 0, 10)
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        with open(log, "a") as f:  # half a line: waits for its newline
            f.write("ERROR 500 n=10")
        await asyncio.sleep(0.3)
        assert scalar(engine, "SELECT count(*) FROM events") == 10
        with open(log, "a") as f:
            f.write("\n")
        await until_events(engine, 11)
        await settled(hub)
    assert ns(engine) == list(range(11))
    assert started(engine) == [0, 2, 4, 6, 8, 10]  # only 5xx codes start an instance
    payload = json.loads(rows(engine, "SELECT payload FROM events ORDER BY id")[0][0])
    line = {"code": "500", "n": "0", "line": "ERROR 500 n=0", "file": str(log)}
    assert payload == {**line, "host": socket.gethostname()}  # the reading daemon's host


async def test_resumes_at_offset_after_restart(tmp_path: Path) -> None:
    flows, log = setup(tmp_path)
    engine = engine_at(tmp_path)
    append(log, 0, 50)
    async with running_hub(engine, flows) as hub:
        await until_events(engine, 50)
        await settled(hub)
    append(log, 50, 80)  # written while no daemon runs
    async with running_hub(engine, flows, "other") as hub:
        append(log, 80, 100)
        await until_events(engine, 100)
        await settled(hub)
    assert ns(engine) == list(range(100))
    assert started(engine) == list(range(0, 100, 2))


async def test_rename_rotation_with_lines_around_it(tmp_path: Path) -> None:
    flows, log = setup(tmp_path)
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        n = 0
        for rotation in range(3):
            for _ in range(4):
                append(log, n, n + 20)
                n += 20
                await asyncio.sleep(0.01)
            await until_events(engine, n)
            append(log, n, n + 20)  # not read yet when the rotation happens
            n += 20
            os.rename(log, log.with_name(f"app.log.{rotation + 1}"))
            append(log.with_name(f"app.log.{rotation + 1}"), n, n + 10)  # late writes, old fd
            n += 10
            append(log, n, n + 20)  # the new file
            n += 20
        await until_events(engine, n)
        await settled(hub)
    assert ns(engine) == list(range(n))


async def test_copytruncate_with_lines_around_it(tmp_path: Path) -> None:
    flows, log = setup(tmp_path)
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        n = 0
        for rotation in range(3):
            for _ in range(4):
                append(log, n, n + 20)
                n += 20
                await asyncio.sleep(0.01)
            await until_events(engine, n)  # one rotation per look (see the module doc)
            append(log, n, n + 20)  # not read yet when the rotation happens
            n += 20
            shutil.copyfile(log, log.with_name(f"app.log.{rotation + 1}"))
            with open(log, "r+") as f:
                f.truncate(0)
            append(log, n, n + 60)  # more than was there before: size alone can't tell
            n += 60
        await until_events(engine, n)
        await settled(hub)
    assert ns(engine) == list(range(n))


async def test_rotation_while_down_finishes_old_file_first(tmp_path: Path) -> None:
    flows, log = setup(tmp_path)
    engine = engine_at(tmp_path)
    append(log, 0, 30)
    async with running_hub(engine, flows) as hub:
        await until_events(engine, 30)
        await settled(hub)
    append(log, 30, 40)  # unread tail of the old file
    os.rename(log, log.with_name("app.log.1"))
    append(log, 40, 55)
    async with running_hub(engine, flows) as hub:
        await until_events(engine, 55)
        await settled(hub)
    ordered = rows(engine, "SELECT payload FROM events ORDER BY id")
    ids = [int(json.loads(p)["n"]) for (p,) in ordered]
    assert ids == list(range(55))  # in order: the old file's rest before the new file


def _default_flow(tmp_path: Path, extra: str = "") -> tuple[Path, Path]:
    flows = tmp_path / "flows"
    body = TAIL_FLOW.replace("from: start, ", extra)
    write_flow(flows, "logs", body)
    log = flows / "logs" / "app.log"
    log.parent.mkdir()
    return flows, log


async def test_new_sensor_starts_at_the_end_by_default(tmp_path: Path) -> None:
    """Like ``tail -f``: lines already in the file start nothing; new ones do; a restart
    resumes at the stored offset (lines written while down count)."""
    flows, log = _default_flow(tmp_path)
    engine = engine_at(tmp_path)
    append(log, 0, 3)
    with open(log, "a") as f:
        f.write("ERROR 500 n=3")  # a partial last line: read once its newline comes
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        await asyncio.sleep(0.3)
        assert scalar(engine, "SELECT count(*) FROM events") == 0
        with open(log, "a") as f:
            f.write("\n")
        append(log, 4, 6)
        await until_events(engine, 3)
        await settled(hub)
    append(log, 6, 8)  # written while no daemon runs
    async with running_hub(engine, flows) as hub:
        await until_events(engine, 5)
        await settled(hub)
    assert ns(engine) == [3, 4, 5, 6, 7]


async def test_from_end_reads_a_rotated_successor_from_its_start(tmp_path: Path) -> None:
    flows, log = _default_flow(tmp_path)
    engine = engine_at(tmp_path)
    append(log, 0, 5)
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        append(log, 5, 7)
        await until_events(engine, 2)
        os.rename(log, log.with_name("app.log.1"))
        append(log, 7, 10)  # the new file: every line counts
        await until_events(engine, 5)
        await settled(hub)
    assert ns(engine) == [5, 6, 7, 8, 9]


async def test_from_start_replays_the_existing_file(tmp_path: Path) -> None:
    flows, log = _default_flow(tmp_path, "from: start, ")
    engine = engine_at(tmp_path)
    append(log, 0, 3)
    async with running_hub(engine, flows) as hub:
        await until_events(engine, 3)
        await settled(hub)
    assert ns(engine) == [0, 1, 2]
