"""The files sensor: bursts, restarts, partial writes, reconciliation — exactly once."""

from __future__ import annotations

import asyncio
import os
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

FILES_FLOW = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt", settle: 100ms}}
rules:
  - when: inbox
    start: drop
    data: {path: "{event.path}", size: "{event.size}"}
"""


def setup(tmp_path: Path, settle: str = "100ms") -> tuple[Path, Path]:
    flows = tmp_path / "flows"
    write_flow(flows, "drop", FILES_FLOW.replace("100ms", settle))
    inbox = flows / "inbox"
    inbox.mkdir()
    return flows, inbox


def drop(inbox: Path, name: str, body: str, *, rename: bool = False) -> None:
    if rename:
        tmp = inbox / f".{name}.part"
        tmp.write_text(body)
        os.rename(tmp, inbox / name)
    else:
        (inbox / name).write_text(body)


def assert_once(engine, expected: set[str]) -> None:
    """Every file has exactly one event and exactly one instance, nothing else."""
    events = rows(engine, "SELECT payload, handled_at, action FROM events")
    import json

    names = [json.loads(p)["name"] for p, _, _ in events]
    assert sorted(names) == sorted(expected)
    assert all(h is not None and a.startswith("started drop") for _, h, a in events)
    paths = [json.loads(d)["path"] for (d,) in rows(engine, "SELECT data FROM instances")]
    assert sorted(os.path.basename(p) for p in paths) == sorted(expected)
    ids = rows(engine, "SELECT event_id FROM instances WHERE event_id IS NULL")
    assert not ids


async def test_burst_of_2000_files_each_acted_on_once(tmp_path: Path) -> None:
    flows, inbox = setup(tmp_path)
    engine = engine_at(tmp_path)
    names = {f"f{i:04d}.txt" for i in range(2000)}
    async with running_hub(engine, flows) as hub:
        for i, name in enumerate(sorted(names)):
            drop(inbox, name, "x" * (i % 50), rename=i % 2 == 0)
            if i % 200 == 0:
                await asyncio.sleep(0)
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") >= 2000, 60)
        await settled(hub)
    assert_once(engine, names)


async def test_hub_restarted_mid_burst_still_exactly_once(tmp_path: Path) -> None:
    flows, inbox = setup(tmp_path)
    engine = engine_at(tmp_path)
    names = [f"g{i:04d}.txt" for i in range(1200)]
    async with running_hub(engine, flows, "first"):
        for i, name in enumerate(names[:600]):
            drop(inbox, name, f"line {i}\n", rename=i % 3 == 0)
            if i % 100 == 0:
                await asyncio.sleep(0.01)
        # stop while files are still being noticed/settling/handled
    for i, name in enumerate(names[600:900]):  # dropped while no daemon runs
        drop(inbox, name, f"line {i}\n")
    async with running_hub(engine, flows, "second") as hub:
        for i, name in enumerate(names[900:]):
            drop(inbox, name, f"line {i}\n", rename=i % 2 == 0)
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") >= 1200, 60)
        await settled(hub)
    # a third start reconciles the same files again and must add nothing
    async with running_hub(engine, flows, "third") as hub:
        await settled(hub)
    assert_once(engine, set(names))


async def test_growing_file_is_not_picked_up_early(tmp_path: Path) -> None:
    flows, inbox = setup(tmp_path, settle="1s")
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        path = inbox / "big.txt"
        with open(path, "w") as f:
            for i in range(25):  # grows every 0.1 s for 2.5 s: 2.5 settle periods
                f.write(f"chunk {i}\n")
                f.flush()
                await asyncio.sleep(0.1)
                assert scalar(engine, "SELECT count(*) FROM events") == 0
            assert hub.pending()
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 1)
        await settled(hub)
    (size,) = rows(engine, "SELECT payload FROM events")[0]
    import json

    assert json.loads(size)["size"] == path.stat().st_size


async def test_files_present_at_start_are_reconciled_and_rename_counts(tmp_path: Path) -> None:
    flows, inbox = setup(tmp_path)
    engine = engine_at(tmp_path)
    for i in range(5):
        drop(inbox, f"old{i}.txt", "x")
    (inbox / "ignored.csv").write_text("not matching the glob")
    (inbox / ".hidden.txt").write_text("hidden")
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        assert scalar(engine, "SELECT count(*) FROM instances") == 5
        drop(inbox, "new.txt", "y", rename=True)
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 6)
        # the same name dropped again with new content is a new event
        (inbox / "new.txt").unlink()
        await asyncio.sleep(0.05)
        drop(inbox, "new.txt", "yy", rename=True)
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 7)
        await settled(hub)
    assert scalar(engine, "SELECT count(*) FROM events") == 7


async def test_touching_a_handled_file_starts_nothing(tmp_path: Path) -> None:
    """Identity is path + inode: a touch or a rewrite in place is not a new file; a new
    file is; and neither is doubled by a restart."""
    flows, inbox = setup(tmp_path)
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        drop(inbox, "a.txt", "one")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 1)
        await settled(hub)
        os.utime(inbox / "a.txt")  # touch
        with open(inbox / "a.txt", "a") as f:
            f.write(" more")
        drop(inbox, "b.txt", "two")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 2)
        await asyncio.sleep(0.5)  # the touched file settles too (and must not count)
        await settled(hub)
    async with running_hub(engine, flows, "other") as hub:
        os.utime(inbox / "b.txt")
        await asyncio.sleep(0.5)
        await settled(hub)
    assert_once(engine, {"a.txt", "b.txt"})


async def test_modified_true_counts_each_change(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "drop", FILES_FLOW.replace("settle: 100ms", "settle: 100ms, modified: true"))
    inbox = flows / "inbox"
    inbox.mkdir()
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        drop(inbox, "a.txt", "one")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 1)
        await settled(hub)
        with open(inbox / "a.txt", "a") as f:
            f.write(" more")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 2)
        await settled(hub)
    sizes = sorted(
        int(s) for (s,) in rows(engine, "SELECT json_extract(data, '$.size') FROM instances")
    )
    assert sizes == [3, 8]


def names_started(engine) -> list[str]:
    """The file names of the instances started, sorted."""
    import json

    return sorted(json.loads(p)["name"] for (p,) in rows(engine, "SELECT payload FROM events"))


async def test_symlinks_out_of_the_folder_are_not_followed(tmp_path: Path, caplog) -> None:
    """A symlink to a file outside the folder (there at start, dropped while running, or
    reached through a second link) starts nothing; a symlink to a file inside does."""
    flows, inbox = setup(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for the flow")
    engine = engine_at(tmp_path)
    drop(inbox, "inner.txt", "in")
    (inbox / "out_at_start.txt").symlink_to(outside / "secret.txt")
    (inbox / "to_inner.txt").symlink_to(inbox / "inner.txt")
    caplog.set_level("INFO", logger="flowrun.sensors")
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        (inbox / "out_later.txt").symlink_to(outside / "secret.txt")
        (inbox / ".hop").symlink_to(outside)  # a hidden link to the folder outside...
        (inbox / "two_hops.txt").symlink_to(inbox / ".hop" / "secret.txt")  # ...and through it
        drop(inbox, "after.txt", "dropped after the links")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 3)
        await asyncio.sleep(0.5)  # the links settle too (and must not count)
        await settled(hub)
    ignored = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert len([m for m in ignored if "'out_later.txt'" in m]) == 1, ignored  # once per path
    assert any("'two_hops.txt'" in m and "follow_symlinks: true" in m for m in ignored), ignored
    async with running_hub(engine, flows, "other") as hub:  # a rescan at start: still not
        await settled(hub)
    assert names_started(engine) == ["after.txt", "inner.txt", "to_inner.txt"]


async def test_follow_symlinks_true_counts_a_link_out_of_the_folder(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(
        flows, "drop", FILES_FLOW.replace("settle: 100ms", "settle: 100ms, follow_symlinks: true")
    )
    inbox = flows / "inbox"
    inbox.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shared.txt").write_text("meant to be shared")
    (inbox / "at_start.txt").symlink_to(outside / "shared.txt")
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        (inbox / "later.txt").symlink_to(outside / "shared.txt")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 2)
        await settled(hub)
    assert names_started(engine) == ["at_start.txt", "later.txt"]


async def test_a_name_that_is_not_utf8_is_one_warning_not_a_dead_sensor(
    tmp_path: Path, caplog
) -> None:
    """A file whose name is not UTF-8 (no database stores it) is skipped with one WARNING
    showing its bytes escaped; the sensor lives on and acts on the files after it."""
    flows, inbox = setup(tmp_path)
    engine = engine_at(tmp_path)
    os.close(os.open(os.fsencode(inbox) + b"/caf\xe9 \x1b[2J.txt", os.O_CREAT | os.O_WRONLY))
    caplog.set_level("INFO", logger="flowrun.sensors")
    async with running_hub(engine, flows) as hub:
        await settled(hub)
        drop(inbox, "after.txt", "dropped after it")
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM instances") == 1)
        await settled(hub)
    warned = [r for r in caplog.records if "not UTF-8" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"
    assert "caf\\xe9 \\x1b[2J.txt" in warned[0].getMessage()
    assert names_started(engine) == ["after.txt"]
