"""Pools in the store (``runner.store.pools``): the limit kept inside the claim, waiters
not due until a slot frees, a lapsed lease freeing its slot, ``set_slots``, the claim
that records its seats itself (PostgreSQL) and says which pools it filled; on a real
SQLite file and on the real PostgreSQL server. Times are passed explicitly (no sleeps)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, event

from runner.errors import UserError
from runner.flowspec.compiled import CompiledFlow
from runner.store import due, leases, pools
from tests.support.fault import either_world, load, new_instance, sql, write_flow

FLOW = """\
initial: load
pools: {warehouse: 2}
states:
  load: {exec: [python, -c, "pass"], pool: warehouse, next: done}
  done: {terminal: true}
"""

LEASE = 30.0
HELD = 2  # the pool's slots
T0 = 2_000_000_000.0  # a fixed "now" far after the instances' creation


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request, tmp_path: Path) -> Iterator[tuple[Engine, CompiledFlow]]:
    engine, flow = either_world(request, tmp_path, "wh", FLOW)
    try:
        yield engine, flow
    finally:
        engine.dispose()


def _claim(engine: Engine, worker: str, at: float, limit: int = 10):
    with engine.begin() as conn:
        return leases.claim_batch(conn, worker, LEASE, limit, at=at)


def test_a_claim_counts_what_the_pool_refused(world) -> None:
    """``claim_batch(refused=...)`` gets the number of claims the pool undid (the worker
    stops claiming ahead on it); none refused: 0."""
    engine, flow = world
    for _ in range(5):
        new_instance(engine, flow)
    refused: list[int] = []
    with engine.begin() as conn:
        got = leases.claim_batch(conn, "w1", LEASE, 10, at=T0, refused=refused)
    assert len(got) == 2 and refused == [3]
    with engine.begin() as conn:
        assert leases.claim_batch(conn, "w2", LEASE, 10, at=T0 + 1, refused=refused) == []
    assert refused == [3], "nothing due, nothing settled: nothing appended"


def _waiting(engine: Engine) -> list[int]:
    rows = sql(engine, "SELECT id FROM instances WHERE waiting_for = 'warehouse' ORDER BY id")
    return [r[0] for r in rows]


def test_claim_keeps_the_limit_and_the_rest_wait_not_due(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    got = _claim(engine, "w1", T0)
    assert [c.id for c in got] == ids[:2]
    assert {c.pool for c in got} == {"warehouse"} and {c.pool_slots for c in got} == {1}
    assert _waiting(engine) == ids[2:]
    # the waiters are not due: another worker claims nothing, and their attempt
    # counts were given back
    assert _claim(engine, "w2", T0 + 1) == []
    assert sql(engine, "SELECT max(attempts) FROM instances WHERE waiting_for IS NOT NULL") == [
        (0,)
    ]
    # one holder ends: its slot wakes exactly one waiter, the oldest
    with engine.begin() as conn:
        sql_done = "UPDATE instances SET running_attempt = NULL, locked_by = NULL WHERE id = :i"
        conn.exec_driver_sql(sql_done.replace(":i", str(got[0].id)))
        pools.release(conn, [got[0]], T0 + 2)
    assert _waiting(engine) == ids[3:]
    again = _claim(engine, "w2", T0 + 3)
    assert [c.id for c in again] == [ids[2]]


def test_a_lapsed_lease_frees_its_slot(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(3)]
    assert len(_claim(engine, "w1", T0)) == 2
    with engine.begin() as conn:  # before the leases lapse: full
        assert pools.sweep(conn, T0 + LEASE - 1) == 0
        assert pools.in_use(conn, "warehouse", T0 + LEASE - 1) == 2
    with engine.begin() as conn:  # after: both slots free, the waiter woken
        assert pools.in_use(conn, "warehouse", T0 + LEASE + 1) == 0
        assert pools.sweep(conn, T0 + LEASE + 1) == 1
    assert _waiting(engine) == []
    assert ids[2] in [c.id for c in _claim(engine, "w2", T0 + LEASE + 2)]


def test_set_slots_wakes_and_resets(world) -> None:
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    _claim(engine, "w1", T0)
    with engine.begin() as conn:
        pools.set_slots(conn, "warehouse", 4, T0 + 1)
    assert _waiting(engine) == ids[4:]
    assert len(_claim(engine, "w2", T0 + 2)) == 2
    with engine.begin() as conn:
        pools.set_slots(conn, "warehouse", None, T0 + 3)
        assert pools.size_of(conn, "warehouse") == 2
    with pytest.raises(UserError, match="unknown pool 'nope'"), engine.begin() as conn:
        pools.set_slots(conn, "nope", 3, T0)


def test_pool_listing_and_metrics(world) -> None:
    from runner.ops.pools import read_pools
    from runner.service.metrics import _pool_families

    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(3)]
    _claim(engine, "w1", T0)
    (pool,) = read_pools(engine, now=T0 + 1)
    assert (pool["name"], pool["slots"], pool["declared"], pool["set"]) == ("warehouse", 2, 2, None)
    assert (pool["in_use"], pool["holders"], pool["waiting"]) == (2, ids[:2], 1)
    assert pool["workers"] == ["w1"]
    families = {f.name: f.samples[0].value for f in _pool_families([pool])}
    assert families == {
        "flowrun_pool_slots": 2,
        "flowrun_pool_in_use": 2,
        "flowrun_pool_waiting": 1,
    }


RATED = """\
initial: call
pools: {api: {slots: 5, rate: 2/10s}}
states:
  call: {exec: [python, -c, "pass"], rate: 3/10s, next: done}
  done: {terminal: true}
"""
POOL_RATED = RATED.replace("rate: 3/10s, next", "pool: api, next")


@pytest.mark.parametrize(("body", "per"), [(RATED, 3), (POOL_RATED, 2)])
def test_a_rate_counts_starts_in_the_window(world, tmp_path: Path, body: str, per: int) -> None:
    engine, _ = world
    flow = load(write_flow(tmp_path / "rated", "rated", body))
    ids = [new_instance(engine, flow) for _ in range(6)]
    got = _claim(engine, "w1", T0)
    assert [c.id for c in got] == ids[:per]
    # the others are not due until the window moves, marked with the rate
    rows = sql(engine, "SELECT due_at, waiting_for FROM instances WHERE locked_by IS NULL")
    what = "state rated.call" if per == 3 else "pool api"
    limit = "3/10s" if per == 3 else "2/10s"
    dues = sorted(round(d - T0, 3) for d, _ in rows)  # spread over the windows to come
    assert dues == ([10.0] * 3 if per == 3 else [10.0, 10.0, 20.0, 20.0])
    assert {w for _, w in rows} == {f"rate {limit} ({what})"}
    assert _claim(engine, "w2", T0 + 9.9) == []
    # once the window moved, as many again (the first ones still run: a rate counts
    # starts, not attempts running)
    assert len(_claim(engine, "w2", T0 + 10.01)) == per


def test_release_of_a_seat_its_commit_cleared_wakes_without_writing_it(world) -> None:
    """``release(cleared=...)``: a claim whose commit gave up its seat already
    (``Outcome.seat_freed``) still wakes a waiter, but its row is not written again (a
    round trip less a cycle); one not in ``cleared`` has its seat forgotten."""
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(4)]
    got = _claim(engine, "w1", T0)
    done = "UPDATE instances SET running_attempt = NULL, locked_by = NULL WHERE id = {}"
    seat = "SELECT pool FROM instances WHERE id = {}"
    with engine.begin() as conn:
        for c in got:
            conn.exec_driver_sql(done.format(c.id))
        pools.release(conn, [got[0]], T0 + 2, cleared={got[0].id})
    assert sql(engine, seat.format(got[0].id)) == [("warehouse",)], "not written"
    assert _waiting(engine) == ids[3:], "its waiter woken all the same"
    with engine.begin() as conn:
        pools.release(conn, [got[1]], T0 + 3)
    assert sql(engine, seat.format(got[1].id)) == [(None,)]
    assert _waiting(engine) == []


def test_a_committed_outcome_gives_up_its_seat_in_its_own_update(world) -> None:
    """The commit of a pooled attempt that releases its instance clears the seat in the
    same ``UPDATE`` (SQLite: ``Hot.commit_pooled``; PostgreSQL: the batch statement) and
    says so (``Outcome.seat_freed``): ``pools.release`` then has no row to write."""
    from runner.engine.outcomes import decide
    from runner.handlers.attempt import AttemptResult
    from runner.store import commit

    engine, flow = world
    iid = new_instance(engine, flow)
    [claim] = _claim(engine, "w1", T0)
    outcome = decide(flow, claim, AttemptResult("moved", claim.data, to_state="done"), {}, T0)
    with engine.begin() as conn:
        assert commit.commit_outcomes(conn, "w1", [outcome], at=T0 + 1) == ([], [])
    assert outcome.seat_freed
    assert sql(engine, f"SELECT pool, pool_slots FROM instances WHERE id = {iid}") == [(None, None)]


def test_next_times_hides_its_time_bound_from_the_postgresql_planner(world) -> None:
    """PostgreSQL: ``next_times`` compares ``due_at`` with a scalar subquery, so a custom
    plan does not look up each range's end through a busy index's dead entries (8 ms of
    planning under a pool's lock); the answer is the same on both databases."""
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(2)]
    sql(engine, f"UPDATE instances SET due_at = {T0 + 60} WHERE id = {ids[1]}")
    with engine.begin() as conn:
        first, _ = due.next_times(conn, T0)
        stmt = due._next_times(conn.dialect.name == "postgresql")
    assert first == T0 + 60
    text = str(stmt.compile(dialect=engine.dialect))
    assert ("> (SELECT" in text) == (engine.dialect.name == "postgresql")


def _seat_writes(engine: Engine) -> list[str]:
    """Every statement that writes ``pool`` on its own (``PoolStatements.hold``), as run."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(conn, cursor, statement, params, context, executemany) -> None:
        if statement.lstrip().upper().startswith("UPDATE INSTANCES SET POOL="):
            seen.append(statement)

    return seen


def _held(engine: Engine) -> list[tuple[int, str | None, int | None]]:
    return [tuple(r) for r in sql(engine, "SELECT id, pool, pool_slots FROM instances ORDER BY id")]


def test_kept_claims_hold_their_seats_and_the_rest_hold_none(world) -> None:
    """Whichever statement records the seats, the claims kept hold them and the ones the
    pool refused (now waiters) hold none; the pool's count stays exact."""
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(2 * HELD)]
    for round_ in range(2):  # the second round: the pooled state is known beforehand
        with engine.begin() as conn:
            got = leases.claim_batch(conn, f"w{round_}", LEASE, 10, at=T0 + round_)
        if round_ == 0:
            assert [c.id for c in got] == ids[:HELD]
            assert _held(engine) == [(i, "warehouse", 1) for i in ids[:HELD]] + [
                (i, None, None) for i in ids[HELD:]
            ]
            with engine.begin() as conn:  # the holders end; their seats are released
                conn.exec_driver_sql(
                    "UPDATE instances SET running_attempt = NULL, locked_by = NULL,"
                    " pool = NULL, pool_slots = NULL, status = 'done', due_at = NULL"
                    f" WHERE id IN ({', '.join(map(str, ids[:HELD]))})"
                )
                pools.wake(conn, "warehouse", HELD, T0)
        else:
            assert [c.id for c in got] == ids[HELD:]
            assert _held(engine)[HELD:] == [(i, "warehouse", 1) for i in ids[HELD:]]
            with engine.begin() as conn:
                assert pools.in_use(conn, "warehouse", T0 + 1) == HELD


@pytest.mark.postgres
@pytest.mark.parametrize("world", ["postgres"], indirect=True)
def test_postgresql_claim_records_the_seats_itself(world) -> None:
    """On PostgreSQL, once the pooled state is known, the claim statement writes the
    seats: no second ``UPDATE`` of the rows kept (before: one a claim). A row the pool
    refuses has its seat undone in the same transaction."""
    engine, flow = world
    ids = [new_instance(engine, flow) for _ in range(5)]
    with engine.begin() as conn:  # the pooled state is met: from now on it is known
        pools.seat_of(conn, flow.version, "load")
    seen = _seat_writes(engine)
    with engine.begin() as conn:
        got = leases.claim_batch(conn, "w1", LEASE, 10, at=T0)
    assert [c.id for c in got] == ids[:HELD] and {c.pool for c in got} == {"warehouse"}
    assert seen == [], "the claim recorded its seats: no separate write"
    held = _held(engine)
    assert held == [(i, "warehouse", 1) for i in ids[:HELD]] + [(i, None, None) for i in ids[HELD:]]
    with engine.begin() as conn:
        assert pools.in_use(conn, "warehouse", T0) == HELD


def test_a_claim_says_which_pools_it_filled(world) -> None:
    """``filled`` names a pool the claim left with no slot free (the worker then claims in
    one cycle at a time); a claim that leaves slots free names none."""
    engine, flow = world
    new_instance(engine, flow)
    filled: list[str] = []
    with engine.begin() as conn:
        assert len(leases.claim_batch(conn, "w1", LEASE, 10, at=T0, filled=filled)) == 1
    assert filled == [], "one slot of two left"
    new_instance(engine, flow)
    new_instance(engine, flow)
    with engine.begin() as conn:
        assert len(leases.claim_batch(conn, "w1", LEASE, 10, at=T0 + 1, filled=filled)) == 1
    assert filled == ["warehouse"]


def test_the_pooled_states_met_are_written_for_the_claim(world) -> None:
    """``seated_json``: every pooled state ``seat_of`` has met, as ``{version: {state:
    [pool, slots]}}``; a state with no pool is not in it."""
    engine, flow = world
    new_instance(engine, flow)  # (its version stored)
    with engine.begin() as conn:
        pools.seat_of(conn, flow.version, "load")
        assert pools.seat_of(conn, flow.version, "done") is None
    text = pools.seated_json()
    assert text is not None
    assert json.loads(text)[flow.version] == {"load": ["warehouse", 1]}
