"""A view that meets an unexpected exception does not take the console down (nor the
embedded worker next to it): the view shows one line in place, the details go to the
log, and the next load that succeeds clears the line (``runner.tui.guard``).

The failures are injected at the boundary the console reads through (the read functions
``runner.tui.data`` imports from ``runner.ops``), under Pilot, on a real SQLite file.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from textual.widgets import Static

import runner.tui.data as console_data
import runner.tui.widgets.instance_table as instance_table
from runner.engine.config import WorkerConfig
from runner.service.console import ConsoleStopper, EmbeddedWorker
from runner.service.startup import load_registry
from runner.store.create import create_instance
from runner.store.db import make_engine
from runner.store.tables import instances
from runner.tui.app import FlowrunApp
from runner.tui.guard import FailureLine
from runner.tui.screens.detail import DetailScreen
from runner.tui.screens.instances import InstancesScreen
from tests.support.hostile_console import assert_alive, assert_literal, settle


def failure(app: FlowrunApp) -> FailureLine:
    return app.screen.query_one(FailureLine)


def boom(*_args, **_kwargs):
    raise RuntimeError("read failed for [/var/lib/app]\x1b[31m\nsecond line")


async def test_detail_load_failure_is_one_line_and_the_console_goes_on(
    app: FlowrunApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        monkeypatch.setattr(console_data, "read_instance", boom)
        with caplog.at_level(logging.ERROR, logger="flowrun.console"):
            await pilot.press("enter")
            await settle(app, pilot)
            app.screen.refresh_data()  # the next refresh fails the same way: logged once
            await settle(app, pilot)
        assert isinstance(app.screen, DetailScreen)
        assert_alive(app)
        assert failure(app).display
        assert_literal(app, "RuntimeError: read failed for [/var/lib/app]\\x1b[31m")
        assert "second line" not in "\n".join(str(s.render()) for s in app.screen.query(Static))
        [record] = [r for r in caplog.records if r.name == "flowrun.console"]
        assert "DetailScreen" in record.getMessage() and record.exc_info is not None
        # the console goes on: the next load that works shows the instance, clears the line
        monkeypatch.undo()
        app.screen.refresh_data()
        await settle(app, pilot)
        assert not failure(app).display
        assert_literal(app, "instance 1", "last error exit status 1: connection refused")
        await pilot.press("escape", "2")
        await settle(app, pilot)
        assert_literal(app, "alpha", "beta")
        assert_alive(app)


async def test_instances_and_side_views_show_their_failure_in_place(
    app: FlowrunApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)

        def outage(*_args, **_kwargs):
            raise OperationalError("SELECT", {}, Exception("unable to open database file"))

        monkeypatch.setattr(console_data, "read_page", outage)
        monkeypatch.setattr(console_data, "read_workers", boom)
        with caplog.at_level(logging.ERROR, logger="flowrun.console"):
            screen = app.screen
            assert isinstance(screen, InstancesScreen)
            screen.refresh_data()
            await settle(app, pilot)
            assert_alive(app)
            assert_literal(app, "database error: unable to open database file")
            await pilot.press("2")
            await settle(app, pilot)
            assert_alive(app)
            assert_literal(app, "RuntimeError: read failed for [/var/lib/app]")
        outage_log = [r for r in caplog.records if "unable to open" in r.getMessage()]
        assert outage_log and outage_log[0].exc_info is None  # an expected fault: no traceback
        monkeypatch.undo()
        await pilot.press("1")
        await settle(app, pilot)
        assert not failure(app).display
        assert_literal(app, "exit status 1: connection")
        assert_alive(app)


async def test_a_failing_view_leaves_the_embedded_worker_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "job.yaml").write_text(
        "flow: job\ninitial: run\nstates:\n"
        f"  run:\n    exec: [{sys.executable}, -c, 'pass']\n    next: done\n"
        "  done: {terminal: true}\n"
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    registry = load_registry(engine, flows)
    embedded = EmbeddedWorker(engine, registry, WorkerConfig(worker_id="embedded", grace=5.0))
    embedded.start()
    try:
        app = FlowrunApp(
            engine, flows_dir=flows, stopper=ConsoleStopper(embedded, 5.0), refresh_interval=0.2
        )

        async def completes(iid: int) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    status = conn.execute(
                        select(instances.c.status).where(instances.c.id == iid)
                    ).scalar_one()
                if status == "completed":
                    return
                await pilot.pause(0.1)
            raise AssertionError(f"instance {iid} is {status}")

        def start() -> int:
            with engine.begin() as conn:
                return create_instance(conn, registry.get("job"), {})

        async with app.run_test(size=(140, 30)) as pilot:
            iid = start()
            await completes(iid)
            deadline = time.monotonic() + 30  # the list shows it (a refresh) before Enter
            while iid not in [r.id for r in app.screen.table.page.rows]:
                assert time.monotonic() < deadline, "the instance never showed in the list"
                await pilot.pause(0.1)
            monkeypatch.setattr(console_data, "read_instance", boom)
            await pilot.press("enter")
            deadline = time.monotonic() + 30
            while not (isinstance(app.screen, DetailScreen) and failure(app).display):
                assert time.monotonic() < deadline, "the detail's failure line never showed"
                await pilot.pause(0.1)
            assert_alive(app)
            await completes(start())  # the embedded worker carries on
            assert embedded.alive() and embedded.error is None
            assert_alive(app)
            await pilot.press("q")  # quits through the stopper: the worker stops cleanly
            deadline = time.monotonic() + 30
            while app.is_running and time.monotonic() < deadline:
                await pilot.pause(0.1)
        assert not app.is_running and app.return_code == 0
    finally:
        embedded.stop(timeout=10)
        engine.dispose()
    assert not embedded.alive() and embedded.error is None


@pytest.mark.parametrize(
    ("target", "keys"),
    [
        ("runner.tui.data.ConsoleData.events", ("3",)),  # the events view's load
        ("runner.tui.data.ConsoleData.flows", ("4",)),  # the flows view's load
        ("runner.tui.data.ConsoleData.explain", ("e",)),  # the explain view's load
        ("runner.store.log_reader.chunks", ("l",)),  # the log view's load
        ("runner.tui.screens.views.WorkersScreen.show", ("2",)),  # showing what it read
    ],
    ids=["events", "flows", "explain", "log", "workers-shown"],
)
async def test_every_view_shows_its_failure_in_place(
    app: FlowrunApp, monkeypatch: pytest.MonkeyPatch, target: str, keys: tuple[str, ...]
) -> None:
    """Whichever view meets the exception, loading or showing what it read: one line in
    place, the console alive; the next view works."""
    async with app.run_test(size=(140, 30)) as pilot:
        await settle(app, pilot)
        monkeypatch.setattr(target, boom)
        app.screen.refresh_data()
        await pilot.press(*keys)
        await settle(app, pilot)
        assert_alive(app)
        assert failure(app).display, target
        assert_literal(app, "RuntimeError: read failed for [/var/lib/app]\\x1b[31m")
        monkeypatch.undo()
        await pilot.press("escape", "1")
        await settle(app, pilot)
        assert_literal(app, "exit status 1: connection")
        assert_alive(app)


async def test_a_row_that_cannot_be_shown_is_one_line_in_its_place(
    app: FlowrunApp, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception while the instances table draws a row (``cells``, at render time,
    outside any thread worker): that row shows the error's line in its place, logged once
    with its traceback; the other rows, the table and the console go on."""
    real = instance_table.cells

    def cells(row, *args, **kwargs):
        if row.id == 1:
            boom()
        return real(row, *args, **kwargs)

    monkeypatch.setattr(instance_table, "cells", cells)
    with caplog.at_level(logging.ERROR, logger="flowrun.console"):
        async with app.run_test(size=(140, 30)) as pilot:
            await settle(app, pilot)
            await pilot.press("down", "up")  # draw the rows again
            await settle(app, pilot)
            assert_alive(app)
            assert_literal(
                app,
                "1 ⚠ cannot show this instance: RuntimeError: read failed for [/var/lib/app]",
                "exit status 2: carrier API",  # the other rows
            )
            await pilot.press("enter")  # the detail of the row that cannot be drawn
            await settle(app, pilot)
            assert isinstance(app.screen, DetailScreen)
            assert_literal(app, "instance 1")
            assert_alive(app)
    logged = [r for r in caplog.records if "row 1" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
