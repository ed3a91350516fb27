"""Stored and typed text is shown literally in every console view: the hostile corpus of
``tests.support.hostile_console`` (brackets, markup tags, ANSI and OSC sequences, NUL and
other controls, right-to-left marks, a 100 kB line, bytes that were not UTF-8) written
into the database and the flows folder, every view opened under Pilot: no exception, no
raw control character on screen, the text shown as it is (controls as escapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from runner.store.tables import instances
from runner.tui import literal
from runner.tui.app import FlowrunApp
from runner.tui.model import Query
from runner.tui.screens.detail import DetailScreen
from runner.tui.screens.dialogs import ChoiceScreen
from runner.tui.screens.explain import ExplainScreen
from runner.tui.screens.instances import InstancesScreen
from runner.tui.screens.logs import LogScreen, LogView
from tests.support.console_db import build_db, clock
from tests.support.hostile_console import (
    ACTION_LINK,
    BIG,
    CACHE_LINE,
    CORPUS,
    OPEN_FAILED,
    PAYMENTS,
    POOL,
    RAW,
    RED_DISK,
    assert_alive,
    assert_literal,
    install,
    settle,
)

SIZE = (160, 45)


@pytest.fixture
def app(tmp_path: Path):
    engine, _path, flows = build_db(tmp_path)
    install(engine, flows)
    yield FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    engine.dispose()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_visible_escapes_every_hidden_character(name: str) -> None:
    shown = literal.visible(CORPUS[name])
    assert RAW.search(shown) is None
    assert len(shown) < 2100  # the 100 kB line is clipped, and says so
    cell = literal.cell(CORPUS[name]).plain
    assert RAW.search(cell) is None and "\n" not in cell


def test_visible_keeps_text_and_names_what_it_escapes() -> None:
    assert literal.visible(RED_DISK) == RED_DISK
    assert literal.visible("\x1b[31mred\x00\u202e\udcff\t") == "\\x1b[31mred\\x00\\u202e\\xff\\t"
    assert literal.visible(b"caf\xe9") == "caf\\xe9"
    assert literal.visible(BIG, 10) == "x" * 10 + "… (+99990 chars)"
    assert literal.visible("a\x1b\nb", multiline=True) == "a\\x1b\nb"
    assert literal.text(RED_DISK).plain == RED_DISK and not literal.text(RED_DISK).spans


async def test_instances_view_and_text_filter(app: FlowrunApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert_literal(
            app,
            OPEN_FAILED + "\\x1",  # last error of instance 1
            RED_DISK + "\\x1b",  # its label
            PAYMENTS + "a\\x00b\\x08c",  # instance 2's label
            "abc\\u202edcba\\u202c \\u200fx",  # instance 4's last error
            "caf\\xe9 [x]\\xff",  # instance 3's label: bytes that are not UTF-8
            "caf\\xe9 [x]\\xff [/]",  # and its last error
        )
        screen = app.screen
        assert isinstance(screen, InstancesScreen)
        screen.set_query(Query(text=RED_DISK))  # as typed in the text filter
        await settle(app, pilot)
        shown = assert_literal(app, f"/{RED_DISK}", "shown 1")
        assert "\n          1 orders" in shown
        assert_alive(app)


async def test_detail_view_of_the_issue(app: FlowrunApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")  # instance 1: the crash of the issue
        await settle(app, pilot)
        assert isinstance(app.screen, DetailScreen)
        assert_literal(
            app,
            f"last error {OPEN_FAILED}\\x1b]0;pwned\\x07",
            f"{RED_DISK}\\x1b[31mred\\x1b[0m",  # the label
            f'"cache_line": "{CACHE_LINE}"',
            f'"red_disk": "{RED_DISK}"',
            '"not_utf8": "caf\\xe9 \\xff\\xfe"',
            '"rtl": "abc\\u202edcba\\u202c \\u200fx\\u2066y\\u2069"',
            "… (+99512 chars)",  # the 100 kB value, clipped
            ACTION_LINK,  # an attempt's worker
            OPEN_FAILED + "\\x1b[31mred\\x1b[0m",  # its error
            f"send {RED_DISK}",  # a command's event
            f"{PAYMENTS} \\x1b[31mred",  # its result
        )
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("down", "enter")  # instance 2: a 100 kB line before its last error line
        await settle(app, pilot)
        assert_literal(app, f"last error {CACHE_LINE}", f"{PAYMENTS}a\\x00b")
        assert_alive(app)


async def test_explain_view(app: FlowrunApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("e")
        await settle(app, pilot)
        assert isinstance(app.screen, ExplainScreen)
        assert_literal(app, f"on {ACTION_LINK}", OPEN_FAILED + "\\x1b[31mred", "(+")
        assert_alive(app)


async def test_workers_events_and_flows_views(app: FlowrunApp) -> None:
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("2")
        await settle(app, pilot)
        assert_literal(app, "w[1]a\\x00b\\x08c\\x7fd\\x9be", "abc\\u202edcba\\u202c")
        await pilot.press("3")
        await settle(app, pilot)
        assert_literal(
            app,
            "[sensor]\\x1b]0;pwned\\x07",
            ACTION_LINK,
            "k\\x1b[31mred\\x1b[0m",
            f"{PAYMENTS}\\x1b]0;pwned\\x07",
            "[app].log: ERROR [cache] code=502",  # what happened: the tail line and file
            f"/in/{RED_DISK}a\\x00b",  # a files event's path
            f"send {RED_DISK}",
        )
        await pilot.press("4")
        await settle(app, pilot)
        assert_literal(
            app,
            f"{PAYMENTS}bad.yaml:3:",
            "e\\x1b[31mvil.yaml:2:",
            RED_DISK,
            "v\\x1b[31mred\\x1b[0m",
            f"/flows/{PAYMENTS}\\x1b]8;;http",
        )
        assert_alive(app)


async def test_dialogs_and_notifications(app: FlowrunApp) -> None:
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(app, pilot)
        await pilot.press("F")  # flow filter: flow names from the database
        await settle(app, pilot)
        assert isinstance(app.screen, ChoiceScreen)
        assert_literal(app, "Filter by flow", RED_DISK)
        await pilot.press("escape")
        app.notify(f"{RED_DISK} {ACTION_LINK} \x1b[2J\x07 {CACHE_LINE}")
        await settle(app, pilot)
        assert_literal(app, f"{RED_DISK} {ACTION_LINK} \\x1b[2J\\x07")
        assert_alive(app)


async def test_log_view(app: FlowrunApp) -> None:
    """``l`` on instance 1: its running attempt's output (``LOG``), every line literal,
    then wrapped (the 100 kB line too) and searched for markup."""
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("l")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, LogScreen) and screen.attempt == 3
        assert_literal(
            app,
            CACHE_LINE,
            OPEN_FAILED + "\\x1b[31mred\\x1b[0m\\x1b]0;pwned\\x07",
            f"{RED_DISK} {ACTION_LINK}\\x1b]8;;http://evil.example\\x1b\\link",
            "a\\x00b\\x08c\\x7fd\\x9be\\rf",
            "abc\\u202edcba\\u202c \\u200fx\\u2066y\\u2069",
            "[long] xxxxxxxx",
            "caf\\xe9 \\xff\\xfe [x] [/] \\x1b[2J end",  # one line, from two chunks
        )
        await pilot.press("w", "G")  # wrapped: the 100 kB line over many rows; the end
        await settle(app, pilot)
        assert_literal(app, "x [/end]", "caf\\xe9 \\xff\\xfe [x]")
        await pilot.press("slash", *"[bold", "enter")
        await settle(app, pilot)
        view = screen.query_one(LogView)
        assert view.match is not None
        assert "[bold" in view.source.lines[view._rows[view.match][0]][1]
        assert_literal(app, RED_DISK)
        await pilot.press("escape")
        await settle(app, pilot)
        assert isinstance(app.screen, InstancesScreen)
        assert_alive(app)


async def test_pool_views_and_command_dialogs(app: FlowrunApp) -> None:
    """A pool named from hostile data, in the workers view's pools and in the instances
    view of an instance that waits for it; the kill, sleep and send dialogs and a
    command's notification on an instance whose label is hostile."""
    with app.engine.begin() as conn:
        conn.execute(
            update(instances)
            .where(instances.c.id == 2)
            .values(status="runnable", due_at=None, waiting_for=POOL, wait_due=1.0)
        )
    async with app.run_test(size=(220, 45), notifications=True) as pilot:
        await settle(app, pilot)
        assert_literal(app, "waits for pool flow:orders:[payments]\\x1b]0;pwned")
        await pilot.press("2")
        await settle(app, pilot)
        assert_literal(
            app, "flow:orders:[payments]\\x1b]0;pwned\\x07abc\\u202edcba\\u202c \\u200fx"
        )
        await pilot.press("1")
        await settle(app, pilot)
        for key, shown in (("k", "Kill instance 1?"), ("z", "Sleep instance 1 for")):
            await pilot.press(key)
            await settle(app, pilot)
            assert_literal(app, shown, RED_DISK)
            await pilot.press("escape")
            await settle(app, pilot)
        await pilot.press("s")
        await settle(app, pilot)
        assert_literal(app, "Send an event to instance 1")
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("p")  # a command: its result notified
        await settle(app, pilot)
        assert_literal(app, "instance 1:", RED_DISK)
        assert_alive(app)
