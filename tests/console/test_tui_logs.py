"""The console's log screen (``l``): an attempt's output, escaped, stepped, searched,
followed (issue 29). Real SQLite file, the real app under Textual's Pilot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import insert
from textual.worker import WorkerCancelled

from runner.store.tables import attempt_logs
from runner.tui.app import FlowrunApp
from runner.tui.screens.instances import InstancesScreen
from runner.tui.screens.logs import LogScreen, LogView
from tests.support.console_db import build_db, clock

SIZE = (120, 30)


def _rows(instance_id: int, attempt: int, pieces: list[tuple[int, bytes]], at: float = 0.0):
    offset, out = 0, []
    for seq, (stream, data) in enumerate(pieces, 1):
        out.append(
            {
                "instance_id": instance_id,
                "attempt": attempt,
                "seq": seq,
                "stream": stream,
                "at": at + seq,
                "offset": offset,
                "data": data,
            }
        )
        offset += len(data)
    return out


HOSTILE = [
    (1, b"fetching page 1\n"),
    (2, b"warning: \x1b[31mred\x1b[0m \x07 and \x1b]0;title\x07\n"),
    (1, b"half a line"),
    (1, b" ended\n"),
    (2, b"Traceback: boom \xff\n"),
]


@pytest.fixture
def engine(tmp_path: Path):
    engine, _path, _flows = build_db(tmp_path)
    with engine.begin() as conn:
        conn.execute(insert(attempt_logs), _rows(1, 1, HOSTILE))
    yield engine
    engine.dispose()


async def _settle(pilot) -> None:
    for _ in range(3):
        await pilot.pause()
        try:
            await pilot.app.workers.wait_for_complete()
        except WorkerCancelled:  # a live refresh replaced an exclusive load: go on
            pass
    await pilot.pause()


def _open_first_attempt():
    async def run_before(pilot) -> None:
        await _settle(pilot)
        assert isinstance(pilot.app.screen, InstancesScreen)
        pilot.app.screen.table.cursor = 0  # instance 1
        await pilot.press("l")
        await _settle(pilot)
        await pilot.press("left_square_bracket", "left_square_bracket")  # 3 -> 1
        await _settle(pilot)

    return run_before


def test_log_screen_shows_escapes_escaped(snap_compare, engine, tmp_path):
    app = FlowrunApp(engine, flows_dir=tmp_path / "flows", clock=clock, live=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=_open_first_attempt())


async def test_log_screen_keys(engine, tmp_path):
    app = FlowrunApp(engine, flows_dir=tmp_path / "flows", clock=clock, live=False)
    async with app.run_test(size=SIZE) as pilot:
        await _open_first_attempt()(pilot)
        screen = app.screen
        assert isinstance(screen, LogScreen) and screen.attempt == 1
        view = screen.query_one(LogView)
        texts = [t for _s, t in view.source.lines]
        assert texts == [
            "fetching page 1",
            "warning: \\x1b[31mred\\x1b[0m \\x07 and \\x1b]0;title\\x07",
            "half a line ended",
            "Traceback: boom \\xff",
        ]
        assert len(view._rows) == 4
        await pilot.press("s")  # stdout only
        assert [view.source.lines[i][1] for i, _a, _b in view._rows] == [
            "fetching page 1",
            "half a line ended",
        ]
        await pilot.press("s", "s")  # stderr only, then both
        assert len(view._rows) == 4
        await pilot.press("slash")
        await pilot.press(*"boom", "enter")
        assert view.match == 3
        await pilot.press("right_square_bracket")  # attempt 2: no output
        await _settle(pilot)
        assert screen.attempt == 2 and view.source.lines == []
        await pilot.press("escape")
        assert isinstance(app.screen, InstancesScreen)


async def test_a_big_log_opens_and_wraps(engine, tmp_path):
    line = b"x" * 199 + b"\n"
    chunk = line * 320  # 64,000 bytes
    with engine.begin() as conn:
        conn.execute(insert(attempt_logs), _rows(2, 1, [(1, chunk)] * 164))  # 10.5 MB
    app = FlowrunApp(engine, flows_dir=tmp_path / "flows", clock=clock, live=False)
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        app.push_screen(LogScreen(2, 1))
        await _settle(pilot)
        view = app.screen.query_one(LogView)
        assert len(view.source.lines) == 164 * 320
        assert len(view._rows) == 164 * 320
        await pilot.press("w")
        assert len(view._rows) == 2 * 164 * 320  # each 199-column line takes 2 rows
        await pilot.press("g")
        assert view.scroll_offset.y == 0
        await pilot.press("G")
        await pilot.pause()
        assert view.scroll_offset.y == view.max_scroll_y > 0


async def _running_attempt_open(pilot, deadline: float) -> None:
    """Open instance 1's log (attempt 3, running in the fixed data) and wait for it."""
    app = pilot.app
    await _settle(pilot)
    app.push_screen(LogScreen(1))
    while not isinstance(app.screen, LogScreen) or app.screen.attempt != 3:
        assert time.monotonic() < deadline
        await pilot.pause(0.05)


async def test_the_log_of_a_running_attempt_is_followed(engine, tmp_path):
    app = FlowrunApp(engine, flows_dir=tmp_path / "flows", clock=clock)  # live
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 30
        await _running_attempt_open(pilot, deadline)
        with engine.begin() as conn:
            conn.execute(insert(attempt_logs), _rows(1, 3, [(1, b"new line\n")]))
        view = app.screen.query_one(LogView)
        while [t for _s, t in view.source.lines] != ["new line"]:
            assert time.monotonic() < deadline, view.source.lines
            await pilot.pause(0.05)


async def test_output_stored_after_the_outcome_is_still_read(engine, tmp_path):
    """The log writer stores an attempt's last output and its end row within a batch of
    the outcome's commit: a screen that saw the attempt end reads on until the end row."""
    from sqlalchemy import update

    from runner.store.tables import attempts, instances

    app = FlowrunApp(engine, flows_dir=tmp_path / "flows", clock=clock)  # live
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 30
        await _running_attempt_open(pilot, deadline)
        screen = app.screen
        now = time.time()
        with engine.begin() as conn:  # the outcome commits; its output is not stored yet
            conn.execute(update(instances).where(instances.c.id == 1).values(running_attempt=None))
            ended = dict(finished_at=now, outcome="moved", to_state="validate", log_bytes=10)
            mine = (attempts.c.instance_id == 1, attempts.c.attempt == 3)
            assert conn.execute(update(attempts).where(*mine).values(**ended)).rowcount == 1
        while screen.running:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        with engine.begin() as conn:  # then the writer's batch: the output, the end row
            conn.execute(insert(attempt_logs), _rows(1, 3, [(1, b"last line\n"), (0, b"")]))
        view = screen.query_one(LogView)
        while [t for _s, t in view.source.lines] != ["last line"] or not view.source.ended:
            assert time.monotonic() < deadline, view.source.lines
            await pilot.pause(0.05)
