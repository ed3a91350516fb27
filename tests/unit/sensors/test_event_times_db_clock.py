"""Events' times and the pruner's "now" are the database's clock (``runner.store.clock``),
as leases and due times are: on a PostgreSQL fleet a host whose clock is off neither
stamps its events apart from the others' nor prunes by its own idea of the date.

The engine is SQLite (one host, the local clock) given a clock of its own, as
``runner.store.pg_engine.pg_engine`` gives every PostgreSQL engine, with a known offset: the
host's clock 90 s ahead of the database's, or 90 s behind.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import update

from runner.ops.prune import Pacing, prune, rules_for
from runner.sensors.events import record_events, store_event
from runner.sensors.rules import RuleEngine
from runner.store.clock import track_server_clock
from runner.store.tables import instances
from tests.support.fault import flow_world, new_instance, sql
from tests.support.sensor_hub import registry, write_flow

FLOW = """\
initial: a
states:
  a: {exec: [/bin/true], next: done}
  done: {terminal: true}
"""

RULES = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt"}}
rules:
  - when: inbox
    start: f
"""

DAY = 86400.0


@pytest.mark.parametrize("host_ahead", [90.0, -90.0])
def test_events_are_stamped_and_handled_by_the_database_clock(
    tmp_path: Path, host_ahead: float
) -> None:
    engine, _flow = flow_world(tmp_path, "f", FLOW)
    clock = track_server_clock(engine, "the test's database")
    clock.offset, clock.error = -host_ahead, 0.0
    try:
        record_events(engine, "rules.inbox", [("a.txt", {"path": "a.txt"})])
        store_event(engine, "rules.inbox", "b.txt", {"path": "b.txt"})
        write_flow(tmp_path / "flows", "rules", RULES)
        assert RuleEngine(engine, registry(tmp_path / "flows")).handle_pending()[0] == 2
        for created, handled in sql(engine, "SELECT created_at, handled_at FROM events"):
            assert created == pytest.approx(clock.now(), abs=5.0)
            assert handled == pytest.approx(clock.now(), abs=5.0)
            assert abs(created - time.time()) > 60  # not the host's own clock
    finally:
        engine.dispose()


@pytest.mark.parametrize("host_ahead", [90.0, -90.0])
def test_the_pruner_judges_age_by_the_database_clock(tmp_path: Path, host_ahead: float) -> None:
    engine, flow = flow_world(tmp_path, "f", FLOW)
    clock = track_server_clock(engine, "the test's database")
    clock.offset, clock.error = -host_ahead, 0.0
    try:
        iid = new_instance(engine, flow)
        # completed 30 days ago less 45 s by the database (kept), or more 45 s (pruned):
        # the host's clock, 90 s off, would judge each the other way
        age = 30 * DAY + (45.0 if host_ahead < 0 else -45.0)
        with engine.begin() as conn:
            conn.execute(
                update(instances)
                .where(instances.c.id == iid)
                .values(status="completed", state="done", updated_at=clock.now() - age)
            )
        counts = prune(engine, rules_for([flow]), pacing=Pacing(rest=0.0, min_rest=0.0))
        assert counts["instances"] == (1 if host_ahead < 0 else 0)
    finally:
        engine.dispose()
