"""An idle hub writes nothing but its sensor leases: the rules' poll finds no event
without the write lock (SQLite) and writes no UPDATE, and a renewal of leases already
held is one statement."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import event

from runner.sensors.events import claim_leases, record_events
from runner.sensors.rules import RuleEngine
from runner.store.db import no_wait_engine
from tests.support.sensor_hub import engine_at, registry, rows, write_flow

FLOW = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt"}}
rules:
  - when: inbox
    start: idle
"""


def test_an_idle_rule_poll_takes_no_write_lock(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "idle", FLOW)
    engine = engine_at(tmp_path)
    eager = no_wait_engine(engine)  # fails at once instead of waiting for the lock
    assert eager is not None
    rules = RuleEngine(eager, registry(flows))
    writer = sqlite3.connect(tmp_path / "flowrun.db", isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # another process writing
        assert rules.handle_pending() == (0, 0)  # before: "database is locked"
        writer.execute("ROLLBACK")
        record_events(engine, "idle.inbox", [("a.txt", {"path": "a.txt"})])
        assert rules.handle_pending() == (1, 1)  # an event still gets its action
        assert rows(engine, "SELECT action FROM events")[0][0].startswith("started idle")
    finally:
        writer.close()
        eager.dispose()
        engine.dispose()


def test_renewing_held_leases_is_one_update(tmp_path: Path) -> None:
    engine = engine_at(tmp_path)
    names = ["f.a", "f.b"]
    assert claim_leases(engine, names, "w1", 30.0) == set(names)  # rows created
    assert claim_leases(engine, names, "w2", 30.0) == set()  # held by w1
    (first,) = rows(engine, "SELECT max(locked_until) FROM sensors")
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2].split()[0]))
    assert claim_leases(engine, names, "w1", 30.0) == set(names)
    assert [s for s in seen if s != "BEGIN"] == ["UPDATE"]  # before: 2 INSERTs, a SELECT
    assert rows(engine, "SELECT max(locked_until) FROM sensors")[0][0] > first[0]
    assert claim_leases(engine, [*names, "f.c"], "w2", 30.0) == {"f.c"}  # a new one
    assert rows(engine, "SELECT name, locked_by FROM sensors ORDER BY name") == [
        ("f.a", "w1"),
        ("f.b", "w1"),
        ("f.c", "w2"),
    ]
    engine.dispose()
