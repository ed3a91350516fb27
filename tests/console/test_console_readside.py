"""The console reads through the CLI's query functions (``runner.ops.queries``): one
status count, one instance read, one worker verdict (alive/late/dead/stopped) at the
console's clock."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import insert, update

from runner.ops import detail, liveness, queries
from runner.store.tables import instances, workers
from runner.tui.data import ConsoleData
from runner.tui.screens.views import VERDICT_STYLES
from tests.support.console_db import NOW, build_db


def _worker(wid: str, heartbeat_at: float, stopped_at: float | None = None) -> dict:
    return {
        "id": wid,
        "host": "gamma",
        "pid": 1,
        "started_at": NOW - 600,
        "heartbeat_at": heartbeat_at,
        "running": 0,
        "stopped_at": stopped_at,
    }


def test_workers_carry_the_one_verdict(tmp_path: Path) -> None:
    engine, _db, _flows = build_db(tmp_path)
    with engine.begin() as conn:
        conn.execute(insert(workers), [_worker("w-late", NOW - 60), _worker("w-dead", NOW - 60)])
        # w-late's heartbeat is as stale as w-dead's, but it still holds a valid lease
        conn.execute(
            update(instances)
            .where(instances.c.id == 3)
            .values(locked_by="w-late", locked_until=NOW + 30)
        )
    data = ConsoleData(engine, clock=lambda: NOW)
    try:
        console = {w["id"]: w for w in data.workers()}
        cli = {w["id"]: w for w in liveness.list_workers(engine, now=NOW)}
        assert {k: w["verdict"] for k, w in console.items()} == {
            "w1": "alive",
            "w2": "stopped",
            "w-late": "late",
            "w-dead": "dead",
        }
        assert {k: w["verdict"] for k, w in cli.items()} == {
            k: w["verdict"] for k, w in console.items()
        }
        assert console["w-late"]["leases"] == 1 and console["w-dead"]["leases"] == 0
        assert set(VERDICT_STYLES) == {"alive", "late", "dead", "stopped"}
    finally:
        data.close()


def test_counts_and_detail_are_the_cli_s(tmp_path: Path) -> None:
    engine, _db, _flows = build_db(tmp_path)
    data = ConsoleData(engine, clock=lambda: NOW)
    try:
        assert data.count_by_status() == queries.count_by_status(engine)
        assert data.count_by_status("orders") == queries.count_by_status(engine, "orders")
        assert sum(queries.count_by_status(engine).values()) == 12
        d = data.detail(1)
        shown = detail.get_instance(engine, 1)
        assert [a["attempt"] for a in d.attempts] == [
            h["attempt"] for h in reversed(shown["history"])
        ]
        assert [c["id"] for c in d.commands] == sorted((c["id"] for c in d.commands), reverse=True)
        assert len(d.commands) == len(shown["commands"])
    finally:
        data.close()
