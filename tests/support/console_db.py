"""Fixed console test data: two compiled flows and a dozen instances in a SQLite file.

Imported by the console tests (``tests/console``). Every timestamp
is relative to ``NOW``, the fixed clock the console is given, so renders are stable.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, insert, update

from runner.flowspec.compiler import load_flow
from runner.store.db import make_engine
from runner.store.tables import (
    attempts,
    commands,
    events,
    flow_versions,
    instances,
    sensors,
    workers,
)

NOW = 1_700_000_000.0


def clock() -> float:
    """The fixed clock of every console test."""
    return NOW


ORDERS = """\
flow: orders
description: Orders wait for approval, then ship.
label: "order {data.order}"
initial: fetch
defaults:
  error_budget: {max_errors: 4, window: 1h, on_exhausted: failed}
states:
  fetch:
    exec: [python, -c, "pass"]
    next: check
  check:
    external: true
    on: {approve: ship, reject: done}
  ship:
    exec: [python, -c, "pass"]
    next: done
  done: {terminal: true}
"""

REPORTS = """\
flow: reports
initial: build
states:
  build:
    exec: [python, -c, "pass"]
    next: done
  done: {terminal: true}
"""


def _row(iid: int, flow, state: str, status: str, **kw) -> dict:
    row = {
        "id": iid,
        "flow": flow.name,
        "version": flow.version,
        "state": state,
        "status": status,
        "data": {"order": iid},
        "label": f"order {iid}" if flow.name == "orders" else None,
        "due_at": None,
        "locked_by": None,
        "locked_until": None,
        "fence": 0,
        "attempts": 0,
        "errors": 0,
        "restarts": 0,
        "state_errors": [],
        "state_restarts": 0,
        "last_error": None,
        "state_changed": NOW - 300,
        "created_at": NOW - 600,
        "updated_at": NOW - 60,
    }
    row.update(kw)
    return row


def build_db(folder: Path, url: str | None = None) -> tuple[Engine, Path, Path]:
    """Create ``folder/flowrun.db`` (or the database of ``url``, e.g. an empty PostgreSQL
    one) with fixed data; returns (engine, db path, flows dir)."""
    flows_dir = folder / "flows"
    flows_dir.mkdir(parents=True, exist_ok=True)
    (flows_dir / "orders.yaml").write_text(ORDERS)
    (flows_dir / "reports.yaml").write_text(REPORTS)
    db = folder / "flowrun.db"
    engine = make_engine(url or "sqlite:///" + str(db))
    orders = load_flow(flows_dir / "orders.yaml")
    reports = load_flow(flows_dir / "reports.yaml")
    rows = [
        _row(
            1,
            orders,
            "fetch",
            "runnable",
            due_at=NOW - 5,
            locked_by="w1",
            locked_until=NOW + 25,
            attempts=3,
            errors=1,
            state_errors=[NOW - 100],
            last_error="exit status 1: connection refused",
        ),
        _row(2, orders, "check", "runnable", attempts=1),
        _row(3, orders, "fetch", "paused", due_at=NOW + 10, attempts=2),
        _row(
            4,
            orders,
            "ship",
            "failed",
            attempts=6,
            errors=4,
            state_errors=[NOW - 3000, NOW - 2000, NOW - 1000, NOW - 10],
            last_error="Traceback (most recent call last): ...\nexit status 2: carrier API down\n",
        ),
        _row(5, orders, "done", "completed", attempts=3),
        _row(
            6,
            orders,
            "fetch",
            "sleeping",
            due_at=NOW + 42,
            attempts=1,
            errors=1,
            state_errors=[NOW - 20],
            last_error="timeout after 2m",
            restarts=1,
        ),
        _row(7, orders, "fetch", "killed", attempts=1),
        _row(8, reports, "build", "runnable", due_at=NOW + 3),
        _row(9, reports, "build", "sleeping", due_at=NOW + 900),
        _row(10, reports, "done", "completed", attempts=1),
        _row(11, orders, "check", "paused", attempts=1),
        _row(
            12,
            reports,
            "build",
            "failed",
            attempts=9,
            errors=8,
            state_errors=[NOW - 60 * i for i in range(1, 9)],
            last_error="exit status 1: no disk",
        ),
    ]
    att = [
        {
            "instance_id": 1,
            "attempt": 1,
            "state": "fetch",
            "worker": "w1",
            "fence": 1,
            "started_at": NOW - 200,
            "finished_at": NOW - 199.5,
            "outcome": "error",
            "to_state": None,
            "error": "exit status 1: connection refused",
            "checkpoint": None,
        },
        {
            "instance_id": 1,
            "attempt": 2,
            "state": "fetch",
            "worker": "w2",
            "fence": 2,
            "started_at": NOW - 100,
            "finished_at": NOW - 98,
            "outcome": "not_yet",
            "to_state": None,
            "error": None,
            "checkpoint": {"page": 3},
        },
        {
            "instance_id": 1,
            "attempt": 3,
            "state": "fetch",
            "worker": "w1",
            "fence": 3,
            "started_at": NOW - 8,
            "finished_at": None,
            "outcome": None,
            "to_state": None,
            "error": None,
            "checkpoint": {"page": 7},
        },
    ]
    for k in range(30):  # throughput: attempts finished over the last 30 seconds
        att.append(
            {
                "instance_id": 5,
                "attempt": 10 + k,
                "state": "fetch",
                "worker": "w2",
                "fence": 1,
                "started_at": NOW - 31 + k,
                "finished_at": NOW - 30.5 + k + (k % 3) * 0.2,
                "outcome": "moved",
                "to_state": "check",
                "error": None,
                "checkpoint": None,
            }
        )
    with engine.begin() as conn:
        # rows written directly: store.record_version remembers versions per process,
        # not per database, so a second test database would miss them
        conn.execute(
            insert(flow_versions),
            [
                {
                    "version": f.version,
                    "flow": f.name,
                    "path": str(f.path),
                    "source": f.source,
                    "loaded_at": NOW - 3600,
                }
                for f in (orders, reports)
            ],
        )
        conn.execute(insert(instances), rows)
        conn.execute(insert(attempts), att)
        conn.execute(
            insert(workers),
            [
                {
                    "id": "w1",
                    "host": "alpha",
                    "pid": 4242,
                    "started_at": NOW - 3600,
                    "heartbeat_at": NOW - 2,
                    "running": 1,
                    "stopped_at": None,
                },
                {
                    "id": "w2",
                    "host": "beta",
                    "pid": 77,
                    "started_at": NOW - 7200,
                    "heartbeat_at": NOW - 900,
                    "running": 0,
                    "stopped_at": NOW - 900,
                },
            ],
        )
        conn.execute(
            insert(events),
            [
                {
                    "sensor": "orders.inbox",
                    "key": "inbox/a.csv",
                    "payload": {"path": "inbox/a.csv"},
                    "created_at": NOW - 50,
                    "handled_at": NOW - 49,
                    "action": "started instance 1",
                },
                {
                    "sensor": "orders.inbox",
                    "key": "inbox/b.csv",
                    "payload": {"path": "inbox/b.csv"},
                    "created_at": NOW - 5,
                    "handled_at": None,
                    "action": None,
                },
            ],
        )
        # a rule's start records the event on the instance (else the listing says pruned)
        conn.execute(update(instances).where(instances.c.id == 1).values(event_id=1))
        conn.execute(
            insert(sensors),
            [
                {
                    "name": "orders.inbox",
                    "cursor": {"seen": 2},
                    "locked_by": "w1",
                    "locked_until": NOW + 20,
                    "updated_at": NOW - 1,
                },
            ],
        )
        conn.execute(
            insert(commands),
            [
                {
                    "instance_id": 3,
                    "command": "pause",
                    "args": {},
                    "source": "cli",
                    "created_at": NOW - 30,
                    "status": "applied",
                    "result": "instance 3: runnable -> paused",
                },
            ],
        )
    return engine, db, flows_dir


def status_of(engine: Engine, iid: int) -> tuple[str, str]:
    """(status, state) of instance ``iid``, read back from the database."""
    from sqlalchemy import select

    with engine.connect() as conn:
        row = conn.execute(
            select(instances.c.status, instances.c.state).where(instances.c.id == iid)
        ).one()
    return row.status, row.state
