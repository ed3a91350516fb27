"""Snapshots of the console's screens with fixed data and a fixed clock.

Update after an intended change with
``pytest tests/console/test_tui_snapshots.py --snapshot-update``
and look at the SVGs in ``tests/console/__snapshots__/test_tui_snapshots/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.tui.app import FlowrunApp
from runner.tui.screens.instances import InstancesScreen
from tests.support.console_db import build_db, clock
from tests.support.hostile_console import install

SIZE = (150, 40)


@pytest.fixture
def hostile_app(tmp_path: Path):
    """The same data with the hostile corpus written into it (``hostile_console``)."""
    engine, _path, flows = build_db(tmp_path)
    install(engine, flows)
    yield FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    engine.dispose()


def settle_then(*keys: str, row: int | None = None):
    """A ``run_before`` that waits for data, optionally moves to a row, presses keys, then
    waits until the screen stops changing (:func:`until_still`)."""

    async def run_before(pilot) -> None:
        app = pilot.app
        for _ in range(3):
            await pilot.pause()
            await app.workers.wait_for_complete()
        if row is not None and isinstance(app.screen, InstancesScreen):
            app.screen.table.cursor = row
        for key in keys:
            await pilot.press(key)
            for _ in range(3):
                await pilot.pause()
                await app.workers.wait_for_complete()
        await until_still(pilot)

    return run_before


async def until_still(pilot, most: int = 50) -> None:
    """Pause until two screenshots in a row are the same (a view's data installed, its
    footer recomposed, its layout refreshed), ``most`` pauses at most: on a loaded machine
    a fixed number of pauses can end before the screen has settled."""
    app = pilot.app
    before = None
    for _ in range(most):
        await pilot.pause()
        await app.workers.wait_for_complete()
        now = app.export_screenshot()
        if now == before:
            return
        before = now


def test_instances_screen(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then(row=3))


def test_instances_marked_and_filtered(snap_compare, app):
    keys = ("space", "space", "f", "down", "enter")  # mark 1 and 2, then status=runnable
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then(*keys))


def test_detail_screen(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("enter", row=0))


def test_kill_confirm_dialog(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("k", row=5))


def test_send_event_chooser(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("s", row=1))


def test_help_screen(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("question_mark"))


def test_workers_screen(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("2"))


def test_events_screen(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("3"))


def test_flows_screen(snap_compare, app):
    flows = app.data.flows_dir
    (flows / "broken.yaml").write_text("flow: broken\ninitial: a\nstates:\n  a: {next: nowhere}\n")
    assert snap_compare(app, terminal_size=SIZE, run_before=settle_then("4"))


def test_hostile_detail_screen(snap_compare, hostile_app):
    """Instance 1's markup-like, ANSI, control and bidi text, shown literally."""
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then("enter", row=0))


def test_hostile_instances_screen(snap_compare, hostile_app):
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then(row=1))


def test_hostile_events_screen(snap_compare, hostile_app):
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then("3"))


def test_hostile_workers_screen(snap_compare, hostile_app):
    """A worker's id and host, a pool's name: controls, bidi marks, OSC, brackets."""
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then("2"))


def test_hostile_flows_screen(snap_compare, hostile_app):
    """Flow files whose names and contents are hostile; a stored version's path."""
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then("4"))


def test_hostile_explain_screen(snap_compare, hostile_app):
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then("e", row=0))


def test_hostile_log_screen(snap_compare, hostile_app):
    """Instance 1's running attempt's output (``hostile_console.LOG``)."""
    assert snap_compare(hostile_app, terminal_size=SIZE, run_before=settle_then("l", row=0))
