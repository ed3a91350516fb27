"""Pilot tests of the console: every key and screen, state read back from the SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, OptionList, Static

from runner.tui.app import FlowrunApp
from runner.tui.model import Query
from runner.tui.screens.detail import DetailScreen
from runner.tui.screens.dialogs import ChoiceScreen, ConfirmScreen, HelpScreen
from runner.tui.screens.instances import InstancesScreen
from runner.tui.screens.views import EventsScreen, FlowsScreen, WorkersScreen
from tests.support.console_db import build_db, clock, status_of
from tests.support.hostile_console import settle


@pytest.fixture
def db(tmp_path: Path):
    engine, path, flows = build_db(tmp_path)
    yield engine, flows
    engine.dispose()


def make_app(db, **kw) -> FlowrunApp:
    engine, flows = db
    return FlowrunApp(engine, flows_dir=flows, clock=clock, live=False, **kw)


async def goto_row(app: FlowrunApp, pilot, iid: int) -> None:
    """Put the cursor on instance ``iid`` (default order: by id, so row iid-1)."""
    screen = app.screen
    assert isinstance(screen, InstancesScreen)
    screen.table.cursor = iid - 1
    await pilot.pause()
    assert screen.table.cursor_row.id == iid


def notes(app: FlowrunApp) -> list[str]:
    return [n.message for n in app._notifications]


async def test_instances_view_lists_rows_and_counts(db):
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, InstancesScreen)
        assert screen.table.total == 12
        assert [r.id for r in screen.table.page.rows] == list(range(1, 13))
        head = screen.header.render_text().plain
        assert "12 instances" in head and "runnable 3" in head and "failed 2" in head
        line = "".join(s.text for s in screen.table.render_line(1))
        assert "w1 25s" in line and "1/4" in line and "connection" in line
        assert "order 1 " in line  # the LABEL column (the flow's label: template)


async def test_p_pauses_then_resumes(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 8)
        await pilot.press("p")
        await settle(app, pilot)
        assert status_of(engine, 8)[0] == "paused"
        assert any("runnable -> paused" in m for m in notes(app))
        await pilot.press("p")
        await settle(app, pilot)
        assert status_of(engine, 8)[0] == "runnable"


async def test_k_asks_then_kills(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 6)
        await pilot.press("k")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await settle(app, pilot)
        assert status_of(engine, 6)[0] == "sleeping"
        await pilot.press("k")
        await pilot.pause()
        await pilot.press("y")
        await settle(app, pilot)
        assert status_of(engine, 6)[0] == "killed"


async def test_r_retries_failed_and_refusal_is_notified(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 4)
        await pilot.press("r")
        await settle(app, pilot)
        assert status_of(engine, 4)[0] == "runnable"
        await goto_row(app, pilot, 5)
        await pilot.press("r")
        await settle(app, pilot)
        assert status_of(engine, 5)[0] == "completed"
        assert "cannot retry: instance 5 is completed" in notes(app)


async def test_s_sends_an_allowed_event(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 2)
        await pilot.press("s")
        await settle(app, pilot)
        assert isinstance(app.screen, ChoiceScreen)
        options = app.screen.query_one(OptionList)
        assert [options.get_option_at_index(i).id for i in range(options.option_count)] == [
            "approve",
            "reject",
        ]
        await pilot.press("enter")  # the first: approve
        await settle(app, pilot)
        assert status_of(engine, 2) == ("runnable", "ship")


async def test_s_on_a_state_without_events_says_so(db):
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 1)
        await pilot.press("s")
        await settle(app, pilot)
        assert isinstance(app.screen, ChoiceScreen)
        assert app.screen.choices == []
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, InstancesScreen)


async def test_space_marks_a_set_and_p_acts_on_all(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 8)
        await pilot.press("space", "space")  # marks 8 and 9
        assert app.screen.table.marked == {8, 9}
        await pilot.press("p")
        await settle(app, pilot)
        assert status_of(engine, 8)[0] == "paused" and status_of(engine, 9)[0] == "paused"
        assert "pause: 2 applied, 0 refused" in notes(app)
        await pilot.press("escape")  # no filter: clears the marks
        assert app.screen.table.marked == set()


async def test_readonly_refuses_every_command(db):
    engine, _ = db
    app = make_app(db, readonly=True)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 1)
        for key in ("p", "k", "r", "s"):
            await pilot.press(key)
            await settle(app, pilot)
            assert isinstance(app.screen, InstancesScreen)
        assert status_of(engine, 1)[0] == "runnable"
        assert "read-only console: pause/resume refused" in notes(app)
        assert "read-only console: kill refused" in notes(app)


async def test_enter_opens_detail_with_graph_budget_and_history(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 1)
        await pilot.press("enter")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, DetailScreen) and screen.instance_id == 1
        graph = str(screen.query_one("#graph", Static).render())
        assert "▶ fetch" in graph and "approve ⇢ ship" in graph
        budget = str(screen.query_one("#budget", Static).render())
        assert "1/4" in budget and "left 3" in budget
        data = str(screen.query_one("#data", Static).render())
        assert '"page": 7' in data
        assert screen.query_one("#attempts", DataTable).row_count == 3
        await pilot.press("p")  # commands work on the detail screen too
        await settle(app, pilot)
        assert status_of(engine, 1)[0] == "paused"
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, InstancesScreen)


async def test_filters_and_sort(db):
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        table = app.screen.table
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, ChoiceScreen)
        await pilot.press("down", "down", "down", "enter")  # all, runnable, sleeping, paused
        await settle(app, pilot)
        assert table.query_spec().status == "paused"
        assert [r.id for r in table.page.rows] == [3, 11] and table.total == 2
        await pilot.press("F")
        await settle(app, pilot)
        await pilot.press("down", "down", "enter")  # all, orders, reports
        await settle(app, pilot)
        assert table.query_spec() == Query(status="paused", flow="reports")
        assert table.total == 0
        await pilot.press("escape")  # clears the filters
        await settle(app, pilot)
        assert table.total == 12
        await pilot.press("slash")
        await pilot.press(*"disk", "enter")
        await settle(app, pilot)
        assert [r.id for r in table.page.rows] == [12]
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("o")  # id -> flow
        await settle(app, pilot)
        assert table.query_spec().sort == "flow"
        assert [r.flow for r in table.page.rows][:1] == ["orders"]
        await pilot.press("O")
        await settle(app, pilot)
        assert table.query_spec().desc and table.page.rows[0].flow == "reports"


async def test_text_filter_applies_as_you_type_and_escape_restores(db):
    """The text filter follows the input after a short pause in typing, without Enter;
    Escape puts back the filter that was there when the input opened."""
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        table = screen.table
        await pilot.press("slash", *"disk")
        await pilot.pause(screen.FILTER_DEBOUNCE + 0.2)
        await settle(app, pilot)
        assert table.query_spec().text == "disk", "applied without enter"
        assert [r.id for r in table.page.rows] == [12]
        assert screen.query_one("#text-filter").display, "the input stays open"
        await pilot.press("escape")
        await settle(app, pilot)
        assert table.query_spec().text == "" and table.total == 12, "escape restores"
        assert not screen.query_one("#text-filter").display
        await pilot.press("slash", *"disk", "enter")  # enter applies at once and keeps it
        await settle(app, pilot)
        assert table.query_spec().text == "disk" and table.total == 1
        await pilot.press("slash", "backspace", "escape")  # opened with "disk": restored
        await settle(app, pilot)
        assert table.query_spec().text == "disk" and table.total == 1


async def test_click_on_header_sorts(db):
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        x = 0
        for col, width in app.screen.table._layout(140):
            if col.key == "attempts":
                break
            x += width + 1
        await pilot.click("#instances", offset=(x + 1, 0))  # the ATT header
        await settle(app, pilot)
        assert app.screen.table.query_spec().sort == "attempts"


async def test_help_and_views(db):
    app = make_app(db)
    async with app.run_test(size=(140, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("2")
        await settle(app, pilot)
        assert isinstance(app.screen, WorkersScreen)
        assert app.screen.query_one("#workers", DataTable).row_count == 2
        await pilot.press("3")
        await settle(app, pilot)
        assert isinstance(app.screen, EventsScreen)
        assert app.screen.query_one("#events", DataTable).row_count == 2
        assert app.screen.query_one("#sensors", DataTable).row_count == 1
        assert app.screen.query_one("#commands", DataTable).row_count == 1
        await pilot.press("4")
        await settle(app, pilot)
        assert isinstance(app.screen, FlowsScreen)
        assert app.screen.query_one("#flows", DataTable).row_count == 2
        assert app.screen.query_one("#versions", DataTable).row_count == 2
        await pilot.press("1")
        await settle(app, pilot)
        assert isinstance(app.screen, InstancesScreen)


async def test_flows_view_shows_validation_errors(db, tmp_path):
    engine, flows = db
    (flows / "broken.yaml").write_text("flow: broken\ninitial: a\nstates:\n  a: {next: nowhere}\n")
    app = make_app(db)
    async with app.run_test(size=(140, 36)) as pilot:
        await pilot.press("4")
        await settle(app, pilot)
        text = str(app.screen.query_one("#flow-errors", Static).render())
        assert "broken.yaml:" in text


async def test_command_palette_runs_actions(db):
    engine, _ = db
    app = make_app(db)
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        await goto_row(app, pilot, 9)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Pause selected")
        from textual.command import CommandList

        for _ in range(50):  # the palette searches asynchronously
            await pilot.pause(0.05)
            if app.screen.query_one(CommandList).option_count:
                break
        await pilot.press("enter")
        await settle(app, pilot)
        assert status_of(engine, 9)[0] == "paused"


async def test_text_filter_finds_the_label_and_detail_shows_it(db):
    """A flow's ``label:`` names each instance: the filter searches it, detail shows it."""
    app = make_app(db)
    async with app.run_test(size=(150, 30)) as pilot:
        await settle(app, pilot)
        table = app.screen.table
        await pilot.press("slash", *"order 7", "enter")  # in no data's JSON text: the label
        await settle(app, pilot)
        assert [r.id for r in table.page.rows] == [7]
        assert table.page.rows[0].label == "order 7"
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, DetailScreen)
        assert "order 7" in str(app.screen.query_one("#summary", Static).render())


async def test_empty_table_says_what_to_do(tmp_path: Path):
    from runner.store.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    (tmp_path / "flows").mkdir()
    app = FlowrunApp(engine, flows_dir=tmp_path / "flows", clock=clock, live=False)
    try:
        async with app.run_test(size=(120, 20)) as pilot:
            await settle(app, pilot)
            line = "".join(s.text for s in app.screen.table.render_line(1))
            assert "no flows in" in line and "flowrun init" in line
            (tmp_path / "flows" / "a.yaml").write_text("x: 1\n")
            app.screen.refresh_data(counts=True)
            await settle(app, pilot)
            line = "".join(s.text for s in app.screen.table.render_line(1))
            assert "no instances yet" in line and "flowrun start" in line
    finally:
        engine.dispose()


async def test_events_view_says_what_happened(db):
    engine, _ = db
    from sqlalchemy import insert

    from runner.store.tables import events

    with engine.begin() as conn:
        conn.execute(
            insert(events),
            {
                "sensor": "orders.app_log",
                "key": "app.log:1234",
                "payload": {
                    "line": "ERROR 502 upstream",
                    "file": "/var/log/app.log",
                    "code": "502",
                },
                "created_at": clock() - 1,
                "handled_at": None,
                "action": None,
            },
        )
    app = make_app(db)
    async with app.run_test(size=(160, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("3")
        await settle(app, pilot)
        table = app.screen.query_one("#events", DataTable)
        what = [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]
        # a tail sensor's file and line, a files sensor's path
        assert what == ["app.log: ERROR 502 upstream", "inbox/b.csv", "inbox/a.csv"]


async def test_an_instance_in_an_external_state_says_which_events_it_waits_for(db):
    engine, _ = db
    from sqlalchemy import update

    from runner.store.tables import instances

    with engine.begin() as conn:  # quarantined after an error: it waits all the same
        conn.execute(
            update(instances).where(instances.c.id == 2).values(last_error="exit status 3: bad")
        )
    app = make_app(db)
    async with app.run_test(size=(200, 30)) as pilot:
        await settle(app, pilot)
        table = app.screen.table
        line = "".join(s.text for s in table.render_line(2))  # instance 2: check, runnable
        assert "on event" in line
        assert "waits for an event: approve, reject · exit status 3: bad" in line
        paused = "".join(s.text for s in table.render_line(11))  # instance 11: check, paused
        assert "waits for" not in paused and "on event" not in paused
        await goto_row(app, pilot, 2)
        await pilot.press("enter")
        await settle(app, pilot)
        summary = app.screen.query_one("#summary", Static).render()
        assert "waits for an event: approve, reject" in str(summary)
        assert "due event" not in str(summary)


async def test_pools_view_and_an_instance_waiting_for_a_slot(db):
    engine, _ = db
    from sqlalchemy import insert, update

    from runner.store.tables import instances, pools

    with engine.begin() as conn:  # instance 1 waits for a slot of the pool 3 holds
        conn.execute(insert(pools).values(name="warehouse", declared=2, slots=1, updated_at=0))
        conn.execute(
            update(instances)
            .where(instances.c.id == 1)
            .values(status="runnable", due_at=None, waiting_for="warehouse", wait_due=1.0)
        )
    app = make_app(db)
    async with app.run_test(size=(200, 36)) as pilot:
        await settle(app, pilot)
        line = "".join(s.text for s in app.screen.table.render_line(1))
        assert " pool " in line and "waits for pool warehouse · exit status 1" in line
        await pilot.press("2")
        await settle(app, pilot)
        table = app.screen.query_one("#pools", DataTable)
        assert table.row_count == 1
        row = [str(c) for c in table.get_row_at(0)]
        assert row[:5] == ["warehouse", "1 (set)", "0", "1", "-"]
