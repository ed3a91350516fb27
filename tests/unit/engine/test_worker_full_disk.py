"""A worker whose SQLite disk is full from the start: it retries with backoff,
and a stop request ends it at once instead of waiting for space. Real SQLite file on a
real 2 MB tmpfs (skipped where mounting is not permitted)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

from sqlalchemy import text

from runner.engine.config import WorkerConfig
from runner.engine.worker import Worker
from runner.store.db import make_engine
from tests.support.disk import fill, small_disk


async def test_stop_while_the_disk_is_full_from_the_start(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="flowrun")
    with small_disk(tmp_path / "disk") as disk:
        db = disk / "flowrun.db"
        engine = make_engine(f"sqlite:///{db}")
        try:
            with engine.connect() as conn:  # an open connection keeps the WAL file
                conn.execute(text("SELECT 1"))
            raw = sqlite3.connect(db)  # empty WAL: the first write needs new space
            assert raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
            raw.close()
            filler = fill(disk)
            worker = Worker(engine, WorkerConfig(worker_id="full", grace=1.0))
            task = asyncio.ensure_future(worker.run())
            for _ in range(600):  # registering the worker fails and is retried
                if "database unavailable" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert "database unavailable" in caplog.text and not task.done()
            assert worker.request_stop() == "graceful"
            await asyncio.wait_for(task, 30)  # at once, not when space comes back
            assert "Traceback" not in caplog.text
            filler.unlink()
        finally:
            engine.dispose()
