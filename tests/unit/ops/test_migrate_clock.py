"""``flowrun migrate`` judges a running attempt's lease by the database's clock
(``runner.store.clock``), as the worker that set it: run from a host whose clock is 90 s
ahead, it still refuses an instance whose attempt holds a live lease (it used to take the
lease for expired and move the instance under the running attempt), and one 90 s behind
still migrates an instance whose attempt's lease ran out.

The engine is SQLite given a clock of its own with a known offset, as
``runner.store.pg_engine.pg_engine`` gives every PostgreSQL engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from runner.flowspec.compiler import load_flow
from runner.ops.migrate import migrate
from runner.store.clock import track_server_clock
from runner.store.create import create_instance, record_version
from runner.store.db import make_engine
from runner.store.tables import instances

V1 = """\
flow: mig
initial: busy
states:
  busy: {exec: [sh, -c, "sleep 1"], next: done}
  done: {terminal: true}
"""
V2 = V1.replace("sleep 1", "sleep 2")


@pytest.mark.parametrize(
    ("host_ahead", "lease_left", "running"), [(90.0, 30.0, True), (-90.0, -30.0, False)]
)
def test_a_running_attempt_is_judged_by_the_database_clock(
    tmp_path: Path, host_ahead: float, lease_left: float, running: bool
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    clock = track_server_clock(engine, "the test's database")
    clock.offset, clock.error = -host_ahead, 0.0
    path = tmp_path / "mig.yaml"
    try:
        path.write_text(V1)
        v1 = load_flow(path)
        path.write_text(V2)
        v2 = load_flow(path)
        with engine.begin() as conn:
            record_version(conn, v1)
            record_version(conn, v2)
            iid = create_instance(conn, v1, {})
            conn.execute(
                update(instances)
                .where(instances.c.id == iid)
                .values(
                    status="running",
                    running_attempt=1,
                    locked_by="w",
                    locked_until=clock.now() + lease_left,
                )
            )
        (result,) = migrate(engine, "mig", v2.version, ids=[iid])
        assert (result.running, result.ok) == (running, not running), result.message
    finally:
        engine.dispose()
