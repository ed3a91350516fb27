"""The console's events view shows each event's deliveries (a rule's exec or webhook:
delivered, FAILED, suppressed by once_per), stored text literally (issue 30, item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert
from textual.widgets import DataTable

from runner.store.tables import deliveries, events
from runner.tui.app import FlowrunApp
from tests.support.console_db import build_db, clock
from tests.support.hostile_console import settle


@pytest.fixture
def db(tmp_path: Path):
    engine, _path, flows = build_db(tmp_path)
    yield engine, flows
    engine.dispose()


def _event(conn, sensor: str, payload: dict) -> int:
    return conn.execute(
        insert(events).returning(events.c.id),
        {
            "sensor": sensor,
            "key": sensor + str(len(payload)),
            "payload": payload,
            "created_at": clock() - 5,
            "handled_at": clock() - 4,
            "action": "rule:f#1 webhook",
        },
    ).scalar_one()


def _delivery(conn, event_id: int, target: dict, **values) -> None:
    row = {
        "event_id": event_id,
        "rule": "rule:f#1",
        "target": target,
        "created_at": clock() - 4,
        "give_up_at": clock() + 3600,
        "suppressed": 0,
        "folded_before": 0,
        "attempts": 1,
        **values,
    }
    conn.execute(insert(deliveries), row)


async def test_events_view_shows_each_delivery_literally(db):
    engine, flows = db
    with engine.begin() as conn:
        hook = _event(conn, "f.trouble", {"instance": 3, "flow": "f", "kind": "failed"})
        _delivery(
            conn,
            hook,
            {"webhook": {"url": "http://alerts.example/hook", "method": "POST"}},
            status="delivered",
            delivered_at=clock() - 3,
            last_result="HTTP 200",
            suppressed=4,
        )
        inbound = _event(conn, "f.deploy", {"body": {"ref": "main"}, "headers": {}})
        _delivery(
            conn,
            inbound,
            {"exec": ["notify", "\x1b[31mred"]},
            status="failed",
            attempts=3,
            last_result="exit 1: \x1b]0;owned\x07 no route",
        )
    app = FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    async with app.run_test(size=(220, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("3")
        await settle(app, pilot)
        table = app.screen.query_one("#events", DataTable)
        columns = [str(c.label) for c in table.columns.values()]
        col = columns.index("deliveries")
        rows = {str(table.get_row_at(i)[0]): table.get_row_at(i) for i in range(table.row_count)}
        sent = str(rows[str(hook)][col])
        assert sent.startswith("webhook POST http://alerts.example/hook: delivered at ")
        assert "after 1 try (HTTP 200), 4 suppressed (once_per)" in sent
        failed = str(rows[str(inbound)][col])
        assert failed == (
            "exec notify \\x1b[31mred: FAILED after 3 tries (exit 1: \\x1b]0;owned\\x07 no route)"
        )
        assert str(rows[str(inbound)][-1]) == 'webhook {"ref":"main"}'
