"""Priorities (``priority: 1..9`` on a flow and a state, ``flowrun start --priority``): the
spec and the compile, the claim's order on a real SQLite file and on the real PostgreSQL
server, the priority a move writes, a pool's waiters woken by priority, and the claim's
plan on 100,000 rows. Times are passed explicitly (no sleeps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, insert

from runner.engine.outcomes import decide
from runner.errors import FlowErrors
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.compiler import compile_source
from runner.handlers.attempt import AttemptResult
from runner.store import commit, due, leases, pools
from runner.store.create import create_instance, initial_row
from runner.store.db import make_engine
from runner.store.hot import hot_for
from runner.store.tables import instances
from tests.support.fault import either_world, engine_at, flow_world, load, sql, write_flow

FLOW = """\
initial: a
priority: 3
pools: {one: 1}
states:
  a: {exec: [python, -c, "pass"], next: b}
  b: {exec: [python, -c, "pass"], next: c, priority: 8}
  c: {exec: [python, -c, "pass"], next: p}
  p: {exec: [python, -c, "pass"], pool: one, next: done}
  done: {terminal: true}
"""

LEASE = 30.0
T0 = 2_000_000_000.0  # a fixed "now" far after the instances' creation


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request, tmp_path: Path) -> tuple[Engine, CompiledFlow]:
    made = either_world(request, tmp_path, "pr", FLOW)
    request.addfinalizer(made[0].dispose)
    return made


def _fill(engine: Engine, flow: CompiledFlow, due_of) -> None:
    """100,000 instances of ``flow``, priorities 1..9 in turn, the k-th due at
    ``due_of(k)``."""
    with engine.begin() as conn:
        create_instance(conn, flow, {}, at=T0)
        base = initial_row(flow, {}, event_id=None, at=T0)
        rows = [{**base, "due_at": due_of(k), "priority": 1 + k % 9} for k in range(100_000)]
        conn.execute(insert(instances), rows)


def _new(engine: Engine, flow: CompiledFlow, at: float, priority: int | None = None) -> int:
    with engine.begin() as conn:
        return create_instance(conn, flow, {}, at=at, priority=priority)


def _claim(engine: Engine, at: float, limit: int = 1):
    with engine.begin() as conn:
        return leases.claim_batch(conn, "w", LEASE, limit, at=at)


def _move(engine: Engine, flow: CompiledFlow, claim, to: str, at: float) -> None:
    result = AttemptResult("moved", claim.data, to_state=to)
    with engine.begin() as conn:
        commit.commit_outcomes(conn, "w", [decide(flow, claim, result, claim.data, at)], at=at)


def _priority(engine: Engine, iid: int) -> int:
    return sql(engine, f"SELECT priority FROM instances WHERE id = {iid}")[0][0]


def test_spec_priority_defaults_overrides_and_bounds(tmp_path: Path) -> None:
    flow = load(write_flow(tmp_path, "pr", FLOW))
    assert {n: s.priority for n, s in flow.states.items()} == {
        "a": 3,
        "b": 8,
        "c": 3,
        "p": 3,
        "done": 3,
    }
    plain = compile_source("initial: a\nstates:\n  a: {terminal: true}\n", "x.yaml")
    assert plain.states["a"].priority == 5
    with pytest.raises(FlowErrors) as bad:
        compile_source(FLOW.replace("priority: 8", "priority: 10"), "bad.yaml")
    assert str(bad.value).startswith("bad.yaml:6:54: states.b.priority")
    with pytest.raises(FlowErrors):
        compile_source(FLOW.replace("priority: 3", "priority: 0"), "bad.yaml")
    row = initial_row(flow, {}, event_id=None, at=1.0)
    assert (row["priority"], row["start_priority"]) == (3, None)
    row = initial_row(flow, {}, event_id=None, at=1.0, priority=9)
    assert (row["priority"], row["start_priority"]) == (9, 9)


def test_higher_priority_is_claimed_first_then_earliest_due(world) -> None:
    engine, flow = world
    low_old = _new(engine, flow, T0 - 50, priority=1)
    mid = _new(engine, flow, T0 - 40)  # the flow's: 3
    high_new = _new(engine, flow, T0 - 10, priority=9)
    high_old = _new(engine, flow, T0 - 20, priority=9)
    later = _new(engine, flow, T0 + 100, priority=9)  # not due yet
    order = [c.id for c in (_claim(engine, T0)[0] for _ in range(4))]
    assert order == [high_old, high_new, mid, low_old]
    assert _claim(engine, T0) == []
    assert [c.id for c in _claim(engine, T0 + 100)] == [later]
    # a batch comes back in the same order
    with engine.begin() as conn:
        conn.execute(instances.update().values(locked_by=None, locked_until=None))
        conn.execute(instances.update().values(running_attempt=None))
    got = _claim(engine, T0 + 200, limit=10)
    assert [c.id for c in got] == [high_old, high_new, later, mid, low_old]
    assert [c.priority for c in got] == [9, 9, 9, 3, 1]


def test_a_move_writes_the_state_priority_unless_the_start_gave_one(world) -> None:
    engine, flow = world
    plain = _new(engine, flow, T0 - 10)
    pinned = _new(engine, flow, T0 - 5, priority=2)
    got = {c.id: c for c in _claim(engine, T0, limit=2)}
    assert got[pinned].pinned and not got[plain].pinned
    for c in got.values():
        _move(engine, flow, c, "b", T0 + 1)
    assert (_priority(engine, plain), _priority(engine, pinned)) == (8, 2)
    got = {c.id: c for c in _claim(engine, T0 + 2, limit=2)}
    for c in got.values():  # back to a state without one: the flow's again
        _move(engine, flow, c, "c", T0 + 3)
    assert (_priority(engine, plain), _priority(engine, pinned)) == (3, 2)
    # a chained attempt keeps the row's priority only where a move leaves it alone
    c = _claim(engine, T0 + 4, limit=2)[0]
    assert c.keeps_priority(None) and c.keeps_priority(c.priority)
    assert c.keeps_priority(8) == c.pinned


def test_a_pools_free_slot_goes_to_the_highest_priority_then_earliest(world) -> None:
    engine, flow = world
    holder = _new(engine, flow, T0 - 100)
    low = _new(engine, flow, T0 - 90, priority=1)
    high_late = _new(engine, flow, T0 - 30, priority=9)
    high = _new(engine, flow, T0 - 40, priority=9)
    with engine.begin() as conn:  # all in the pooled state
        conn.execute(instances.update().values(state="p"))
    held = _claim(engine, T0, limit=10)
    assert [c.id for c in held] == [high]  # the claim's order: the pool's one slot
    assert sql(engine, "SELECT count(*) FROM instances WHERE waiting_for = 'one'") == [(3,)]
    for expected in (high_late, holder, low):
        with engine.begin() as conn:
            ids = ",".join(str(c.id) for c in held)
            conn.exec_driver_sql(
                f"UPDATE instances SET running_attempt = NULL, locked_by = NULL WHERE id IN ({ids})"
            )
            pools.release(conn, held, T0 + 1)
        held = _claim(engine, T0 + 2, limit=10)
        assert [c.id for c in held] == [expected]


def test_the_claim_reads_the_index_in_order_on_100k_rows(tmp_path: Path) -> None:
    """SQLite: one range of ``ix_instances_claim`` per status and priority, no scan of the
    table and no sort of every due row (only the union of at most 2 × n rows is sorted);
    the claim of 64 among 100,000 (half of them due, priorities mixed, some external)
    takes the highest priorities first."""
    engine = engine_at(tmp_path)
    flow = load(write_flow(tmp_path / "flows", "pr", FLOW))
    try:
        _fill(engine, flow, lambda k: None if k % 10 == 0 else T0 + (k % 2) * 1000 + k * 1e-3)
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        with engine.connect() as conn:
            claim = hot_for(conn).claim.sql  # positional on SQLite: the plan takes no value
            params = tuple([0] * claim.count("?"))
            plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + claim, params).all()
        details = [r[-1] for r in plan]
        searches = [d for d in details if "SEARCH instances USING INDEX" in d]
        range_ = "ix_instances_claim (status=? AND priority=? AND due_at<?)"
        assert len(searches) == 2 and all(range_ in d for d in searches), details
        assert "SEARCH instances USING INTEGER PRIMARY KEY (rowid=?)" in details, details
        assert not any(d.startswith("SCAN instances") for d in details), details
        assert not any("RIGHT PART OF ORDER BY" in d for d in details), details
        got = _claim(engine, T0 + 500, limit=64)
        assert len(got) == 64 and {c.priority for c in got} == {9}
        assert [c.started_at for c in got] == [T0 + 500] * 64
        with engine.connect() as conn:  # an idle worker's look for the next due time
            assert due.next_times(conn, T0 + 500)[0] == pytest.approx(T0 + 1000.001)
            statement, params = _first_statement(conn, lambda: due.next_times(conn, T0 + 500))
            plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params).all()
        steps = [r[-1] for r in plan if "instances" in r[-1]]
        ranges = [d for d in steps if "ix_instances_claim" in d]
        assert len(ranges) == 18 and all(range_.replace("<", ">") in d for d in ranges), steps
        assert not any(d.startswith("SCAN instances") for d in steps), steps
    finally:
        engine.dispose()


def _first_statement(conn, run) -> tuple[str, Any]:
    """The SQL and parameters of the first statement ``run()`` sends on ``conn``."""
    seen: list[tuple[str, Any]] = []

    def grab(_conn, _cursor, statement, parameters, *_rest) -> None:
        seen.append((statement, parameters))

    event.listen(conn, "before_cursor_execute", grab)
    try:
        run()
    finally:
        event.remove(conn, "before_cursor_execute", grab)
    return seen[0]


@pytest.mark.postgres
def test_the_claim_plans_an_ordered_index_scan_per_priority_on_postgresql(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    flow = load(write_flow(tmp_path / "flows", "pr", FLOW))
    try:
        _fill(engine, flow, lambda k: T0 + (k % 2) * 1000)
        with engine.begin() as conn:
            leases.by_index(conn)
            prepared = hot_for(conn).claim
            params = {
                **prepared.defaults,
                "at": T0 + 500,
                "n": 64,
                "w": "w",
                "until": 1.0,
                "labels": "{}",
            }
            plan = "\n".join(
                conn.exec_driver_sql("EXPLAIN " + prepared.sql, params).scalars().all()
            )
        # one ordered range per (status, priority) pair of the VALUES list, looped over
        assert plan.count("Index Scan using ix_instances_claim") == 1, plan
        assert "Values Scan" in plan and "Nested Loop" in plan, plan
        assert '(priority = "*VALUES*".column2) AND (due_at <=' in plan, plan
        assert "Seq Scan on instances" not in plan and "Bitmap" not in plan, plan
        got = _claim(engine, T0 + 500, limit=64)
        assert len(got) == 64 and {c.priority for c in got} == {9}
        with engine.begin() as conn:  # an idle worker's look for the next due time
            leases.by_index(conn)
            statement, params = _first_statement(conn, lambda: due.next_times(conn, T0 + 500))
            plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, params).scalars())
        # one ordered range per pair again, each its first entry (LIMIT 1): the union of
        # 18 SELECTs it replaced cost 5.4 ms to plan
        assert plan.count("Index Scan using ix_instances_claim") == 1, plan
        assert "Values Scan" in plan and "Limit" in plan, plan
        assert "Seq Scan on instances" not in plan, plan
    finally:
        engine.dispose()


SENT = """\
initial: wait
priority: 4
states:
  wait: {external: true, on: {go: urgent}}
  urgent: {exec: [python, -c, "pass"], next: done, priority: 8}
  done: {terminal: true}
"""


def test_a_command_moving_an_instance_writes_the_state_priority_unless_pinned(
    tmp_path: Path,
) -> None:
    from runner.ops.commands import submit

    engine, flow = flow_world(tmp_path, "sent", SENT)
    try:
        plain, pinned = _new(engine, flow, T0), _new(engine, flow, T0, priority=2)
        assert (_priority(engine, plain), _priority(engine, pinned)) == (4, 2)
        results = submit(engine, [plain, pinned], "send", event="go")
        assert all(r.ok for r in results), results
        assert (_priority(engine, plain), _priority(engine, pinned)) == (8, 2)
    finally:
        engine.dispose()
