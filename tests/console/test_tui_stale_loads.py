"""A view shows its newest load, never an older one that finished late
(``runner.tui.guard.deliver``), and a side view loads once when it is first shown.

A console thread worker cannot be stopped: cancelling an ``exclusive`` load ends its
asyncio task while its thread reads on. Its result used to be installed whenever that
thread finished, over the newer one; on a loaded machine that happened between a
snapshot test's settling and its screenshot.
"""

from __future__ import annotations

import sys
import threading

from textual.widgets import Static

from runner.tui.app import FlowrunApp
from runner.tui.model import FlowsInfo
from runner.tui.screens.views import FlowsScreen
from tests.support.hostile_console import assert_alive, settle


def _in_reload(ident: int) -> bool:
    """Whether thread ``ident`` is still inside a view's ``_reload`` (loading or
    delivering); an idle executor thread is not."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_name == "_reload":
            return True
        frame = frame.f_back
    return False


def _errors_text(app: FlowrunApp) -> str:
    return str(app.screen.query_one("#flow-errors", Static).render())


async def test_a_load_that_finishes_after_a_newer_one_is_not_shown(app: FlowrunApp) -> None:
    release = threading.Event()
    first: list[int] = []
    calls = 0

    def flows() -> FlowsInfo:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first load is slow: a newer one starts and ends meanwhile
            first.append(threading.get_ident())
            assert release.wait(10)
            return FlowsInfo(note="stale load")
        return FlowsInfo(note="fresh load")

    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        app.data.flows = flows  # type: ignore[method-assign]
        await pilot.press("4")
        for _ in range(2000):  # until the first load is under way in its thread
            if first:
                break
            await pilot.pause(0.01)
        assert isinstance(app.screen, FlowsScreen) and first
        app.screen.refresh_data()  # the newer load: cancels the first one's task
        await settle(app, pilot)
        assert "fresh load" in _errors_text(app)
        release.set()
        for _ in range(2000):  # until the first load's thread has left _reload
            if not _in_reload(first[0]):
                break
            await pilot.pause(0.01)
        assert not _in_reload(first[0])
        await settle(app, pilot)
        assert "fresh load" in _errors_text(app), "the stale load was shown"
        assert calls == 2
        assert_alive(app)


async def test_a_side_view_loads_once_when_first_shown(app: FlowrunApp) -> None:
    real = app.data.flows
    calls = 0

    def flows() -> FlowsInfo:
        nonlocal calls
        calls += 1
        return real()

    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        app.data.flows = flows  # type: ignore[method-assign]
        await pilot.press("4")
        await settle(app, pilot)
        assert "all flows valid" in _errors_text(app)
        assert calls == 1
        await pilot.press("1", "4")  # shown again: loaded again
        await settle(app, pilot)
        assert calls == 2
        assert_alive(app)
