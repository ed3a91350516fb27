"""runner.store.prune on SQLite: each batch finds its rows by key, whatever the table size.

A prune deletes in batches of a few hundred instances named by id. If SQLite answered a
batch by walking an index over every instance of the status (as it did: no ``ANALYZE``
statistics make ``status = ?`` look selective), a prune of N instances would cost O(N²).
The plans are read from the real SQLite planner on a real file holding many completed
instances.
"""

from __future__ import annotations

import sqlite3
import time

from sqlalchemy import insert

from runner.store import prune_instances
from runner.store.db import make_engine
from runner.store.dialect import dialect_of
from runner.store.tables import instances


def _plan(engine, stmt, params: dict) -> str:
    compiled = stmt.compile(engine)
    values = compiled.construct_params(params)
    args = [values[k] for k in compiled.positiontup]
    raw = sqlite3.connect(engine.url.database)
    try:
        rows = raw.execute("EXPLAIN QUERY PLAN " + str(compiled), args).fetchall()
    finally:
        raw.close()
    return "\n".join(r[-1] for r in rows)


def _filled(tmp_path, n: int = 3000):
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    now = time.time()
    row = {
        "flow": "f",
        "version": "v",
        "state": "done",
        "status": "completed",
        "data": {},
        "state_errors": [],
        "created_at": now,
        "updated_at": now,
        "state_changed": now,
    }
    with engine.begin() as conn:
        conn.execute(insert(instances), [row] * n)
    return engine


def test_instance_deletion_looks_ids_up_by_key(tmp_path) -> None:
    engine = _filled(tmp_path)
    d = dialect_of(engine)
    stmt = prune_instances.deletion(d)
    params = {"ids": d.ids_value([1, 2, 3]), "status": "completed", "cutoff": time.time()}
    plan = _plan(engine, stmt, params)
    assert "ix_instances_claim" not in plan, plan
    assert "ix_instances_flow_status" not in plan, plan
    assert "SCAN instances" not in plan, plan
    engine.dispose()


def test_instance_deletion_deletes_only_deletable_rows(tmp_path) -> None:
    engine = _filled(tmp_path, 10)
    later = time.time() + 60
    with engine.begin() as conn:
        conn.execute(instances.update().where(instances.c.id == 2).values(locked_by="w"))
        conn.execute(instances.update().where(instances.c.id == 3).values(status="runnable"))
    got = prune_instances.delete_instances(engine, [1, 2, 3, 4], "completed", later)
    assert got["instances"] == 2
    with engine.connect() as conn:
        left = sorted(conn.execute(instances.select().with_only_columns(instances.c.id)).scalars())
    assert left == [2, 3, 5, 6, 7, 8, 9, 10]
    engine.dispose()
