"""Routing by label and deadlines together: a state entered by either one's move gets
both the state's ``runs_on`` (over the instance's data and starting event) and its
``deadline_at``. On a real SQLite file and on the real PostgreSQL server; times are
explicit (the deadline is placed in the past, no sleeps)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from runner import labels
from runner.flowspec.compiled import CompiledFlow
from runner.ops.deadlines import fire_due
from runner.store import routing
from runner.store.create import create_instance
from runner.store.tables import instances
from tests.support.fault import either_world, sql

FLOW = """\
initial: wait
states:
  wait:
    external: true
    on: {ok: done}
    deadline: {after: 1h, then: work}
  work:
    exec: [python, -c, "pass"]
    next: done
    runs_on: {site: "{data.site}", host: "{event.host}"}
    routing_timeout: {after: 1m, then: late}
  late:
    external: true
    on: {ok: done}
    deadline: {after: 1h, then: failed}
  done: {terminal: true}
"""

HOUR = 3600.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request, tmp_path: Path) -> tuple[Engine, CompiledFlow]:
    made = either_world(request, tmp_path, "rd", FLOW)
    request.addfinalizer(made[0].dispose)
    return made


def test_a_deadline_move_writes_the_requirement_over_data_and_event(world) -> None:
    engine, flow = world
    made = time.time() - 2 * HOUR  # its 1h deadline has passed by the database's clock
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {"site": "rome"}, at=made, event={"host": "h9"})
    [missed] = fire_due(engine, "w1")
    assert missed.instance == iid and missed.then == "work"
    [(state, runs_on, deadline_at)] = sql(
        engine, f"SELECT state, runs_on, deadline_at FROM instances WHERE id = {iid}"
    )
    assert state == "work" and deadline_at is None  # work has no deadline
    assert labels.decode(runs_on) == {"site": "rome", "host": "h9"}


def test_a_routing_timeout_move_sets_the_next_deadline(world) -> None:
    engine, flow = world
    at = 2_000_000_000.0
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {"site": "oslo"}, at=at, event={"host": "h1"})
        required = labels.canonical({"site": "oslo", "host": "h1"})
        conn.execute(
            update(instances)
            .where(instances.c.id == iid)
            .values(state="work", runs_on=required, deadline_at=None, due_at=at)
        )
        assert routing.sweep(conn, at + 61) == 1  # no worker ever: moved to late
    [(state, deadline_at)] = sql(
        engine, f"SELECT state, deadline_at FROM instances WHERE id = {iid}"
    )
    assert state == "late" and deadline_at == pytest.approx(at + 61 + HOUR)
