"""``e`` in the console shows ``flowrun explain``'s text (Pilot, a real SQLite file)."""

from __future__ import annotations

from pathlib import Path

from runner.ops.detail import instance_rows
from runner.ops.explain import explain
from runner.ops.explanation import render_text
from runner.store.versions import compiled
from runner.tui.app import FlowrunApp
from runner.tui.screens.detail import DetailScreen
from runner.tui.screens.explain import ExplainScreen
from runner.tui.screens.instances import InstancesScreen
from tests.support.console_db import build_db, clock


async def _settle(app: FlowrunApp, pilot) -> None:
    for _ in range(4):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


async def test_e_explains_the_instance_under_the_cursor(tmp_path: Path) -> None:
    engine, _, flows = build_db(tmp_path)
    app = FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await _settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, InstancesScreen)
        screen.table.cursor = 0
        await pilot.pause()
        await pilot.press("e")
        await _settle(app, pilot)
        assert isinstance(app.screen, ExplainScreen) and app.screen.instance_id == 1
        expected = render_text(
            explain(instance_rows(engine, 1), lambda v: compiled(engine, v), clock()), clock()
        )
        assert app.screen.text == expected
        assert "What happened" in expected and "What happens next" in expected
        assert "attempt 1 in 'fetch'" in expected
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("enter")  # from the detail screen too
        await _settle(app, pilot)
        assert isinstance(app.screen, DetailScreen)
        await pilot.press("e")
        await _settle(app, pilot)
        assert isinstance(app.screen, ExplainScreen) and app.screen.text == expected
    engine.dispose()


async def test_z_sleeps_and_w_wakes(tmp_path: Path) -> None:
    from runner.tui.screens.dialogs import ChoiceScreen
    from tests.support.console_db import status_of
    from tests.support.fault import row

    engine, _, flows = build_db(tmp_path)
    runnable = next(i for i in range(1, 13) if status_of(engine, i)[0] == "runnable")
    app = FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await _settle(app, pilot)
        app.screen.table.cursor = runnable - 1
        await pilot.pause()
        await pilot.press("z")
        await _settle(app, pilot)
        assert isinstance(app.screen, ChoiceScreen)
        await pilot.press("down", "enter")  # the second choice: 1h
        await _settle(app, pilot)
        r = row(engine, runnable)
        assert r["status"] == "sleeping" and r["due_at"] == clock() + 3600
        await pilot.press("w")
        await _settle(app, pilot)
        assert status_of(engine, runnable)[0] == "runnable"
    engine.dispose()


async def test_flows_view_counts_instances_per_version(tmp_path: Path) -> None:
    from textual.widgets import DataTable

    from runner.tui.screens.views import FlowsScreen
    from tests.support.fault import sql

    engine, _, flows = build_db(tmp_path)
    per_version = dict(sql(engine, "SELECT version, COUNT(*) FROM instances GROUP BY version"))
    app = FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await _settle(app, pilot)
        await pilot.press("4")
        await _settle(app, pilot)
        assert isinstance(app.screen, FlowsScreen)
        table = app.screen.query_one("#versions", DataTable)
        cells = {
            str(table.get_row_at(i)[1]): str(table.get_row_at(i)[3]) for i in range(table.row_count)
        }
        for version, n in per_version.items():
            assert cells[version].startswith(f"{n}: "), cells
    engine.dispose()


async def test_m_in_the_flows_view_migrates_to_the_loaded_version(tmp_path: Path) -> None:
    from runner.flowspec.compiler import load_flow
    from runner.tui.screens.dialogs import ConfirmScreen
    from runner.tui.screens.views import FlowsScreen
    from tests.support.fault import sql

    engine, _, flows = build_db(tmp_path)
    path = flows / "orders.yaml"
    old = load_flow(path).version
    path.write_text(path.read_text() + "\n# a new version\n")
    new = load_flow(path).version
    app = FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await _settle(app, pilot)
        await pilot.press("4")
        await _settle(app, pilot)
        assert isinstance(app.screen, FlowsScreen)
        await pilot.press("m")  # the cursor is on the first loaded flow: orders
        await _settle(app, pilot)
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await _settle(app, pilot)
    versions = dict(sql(engine, "SELECT id, version FROM instances WHERE flow = 'orders'"))
    statuses = dict(sql(engine, "SELECT id, status FROM instances WHERE flow = 'orders'"))
    moved = [i for i, v in versions.items() if v == new]
    assert moved and all(statuses[i] not in ("completed", "killed") for i in moved)
    assert all(versions[i] == old for i, s in statuses.items() if s in ("completed", "killed"))
    audit = sql(
        engine, "SELECT instance_id FROM commands WHERE command = 'migrate' AND source = 'tui'"
    )
    assert sorted(i for (i,) in audit) >= sorted(moved)
    engine.dispose()
