"""The console on a full disk: a command that cannot be written is one
notification line naming the full disk; the console carries on and nothing is written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import text

from runner.tui.app import FlowrunApp
from tests.support.console_db import build_db, clock, status_of
from tests.support.disk import fill, small_disk


async def test_command_on_full_disk_is_one_line(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        engine, db, flows = build_db(disk)
        try:
            with engine.connect() as conn:  # an open connection keeps the WAL file
                conn.execute(text("SELECT 1"))
            raw = sqlite3.connect(db)  # empty the WAL: the next write needs new space
            assert raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
            raw.close()
            filler = fill(disk)
            app = FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
            async with app.run_test(size=(140, 30)) as pilot:
                for _ in range(4):
                    await pilot.pause()
                    await app.workers.wait_for_complete()
                app.screen.table.cursor = 7
                await pilot.pause()
                await pilot.press("p")
                for _ in range(4):
                    await pilot.pause()
                    await app.workers.wait_for_complete()
                notes = [n.message for n in app._notifications]
                failed = [m for m in notes if m.startswith("pause: database write failed")]
                assert failed and "\n" not in failed[0] and "full" in failed[0], notes
            assert status_of(engine, 8)[0] == "runnable"
            filler.unlink()
            with engine.connect() as conn:
                assert conn.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        finally:
            engine.dispose()
