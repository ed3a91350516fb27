"""The hub's inotify watcher (``runner.sensors.inotify``): the changes ``watchfiles``
would report, in batches, recursively (a folder made after the start is watched too),
and nothing at all while nothing changes; real files, a real inotify descriptor."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from watchfiles import Change

from runner.sensors import inotify
from runner.store import inotify_sys

pytestmark = pytest.mark.skipif(not inotify_sys.available(), reason="Linux inotify")


async def _next(gen, timeout: float = 5.0) -> set:
    return await asyncio.wait_for(anext(gen), timeout)


def test_changes_come_in_batches_recursively(tmp_path: Path) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        gen = inotify.changes([tmp_path], debounce=50, step=20, stop=stop)
        first = asyncio.ensure_future(_next(gen))
        await asyncio.sleep(0.05)  # the watches exist after the first step
        (tmp_path / "a.txt").write_text("x")
        assert (Change.added, str(tmp_path / "a.txt")) in await first
        (tmp_path / "a.txt").rename(tmp_path / "b.txt")
        assert await _next(gen) >= {
            (Change.deleted, str(tmp_path / "a.txt")),
            (Change.added, str(tmp_path / "b.txt")),
        }
        (tmp_path / "sub").mkdir()
        assert (Change.added, str(tmp_path / "sub")) in await _next(gen)
        with open(tmp_path / "sub" / "c.log", "w") as f:  # in a folder made after the start
            f.write("line\n")
        got = await _next(gen)
        assert (Change.added, str(tmp_path / "sub" / "c.log")) in got
        with open(tmp_path / "sub" / "c.log", "a") as f:
            f.write("more\n")
        assert (Change.modified, str(tmp_path / "sub" / "c.log")) in await _next(gen)
        os.unlink(tmp_path / "b.txt")
        assert (Change.deleted, str(tmp_path / "b.txt")) in await _next(gen)
        # nothing changes: nothing comes (no poll either: the loop is never woken)
        quiet = asyncio.ensure_future(_next(gen, timeout=0.5))
        with pytest.raises(TimeoutError):
            await quiet
        stop.set()
        await gen.aclose()

    asyncio.run(scenario())


def test_a_missing_folder_fails_at_the_first_step(tmp_path: Path) -> None:
    async def scenario() -> None:
        gen = inotify.changes([tmp_path / "nope"], debounce=10, step=5, stop=asyncio.Event())
        with pytest.raises(FileNotFoundError):
            await anext(gen)

    asyncio.run(scenario())
