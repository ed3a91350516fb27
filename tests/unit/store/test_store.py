"""Claim, lease and fencing (design §3) on a real SQLite file, and the fenced commit on
the real PostgreSQL server too (``any_world``: there a batch is one statement,
``runner.store.batch``).

Two workers are two engines on one file, claiming from two threads; leases expire by
passing an explicit ``at`` to the store (the claim query compares stored times), so no
test sleeps or depends on timing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.engine.outcomes import decide
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.policy import Policy
from runner.handlers.attempt import AttemptResult
from runner.ops import commands
from runner.store import commit, create, leases
from runner.store.db import make_engine
from tests.support.fault import (
    attempts_of,
    engine_at,
    flow_world,
    load,
    new_instance,
    policy,
    row,
    sql,
    write_flow,
)

FLOW = """\
initial: work
defaults:
  max_restarts: 1
states:
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""

LEASE = 30.0


@pytest.fixture
def world(tmp_path: Path) -> tuple[Engine, CompiledFlow]:
    return flow_world(tmp_path, "st", FLOW)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_world(request, tmp_path: Path) -> Iterator[tuple[Engine, CompiledFlow]]:
    """``world`` on SQLite, then on a fresh PostgreSQL database (``pg_url``)."""
    if request.param == "sqlite":
        engine = engine_at(tmp_path)
    else:
        engine = make_engine(request.getfixturevalue("pg_url"))
    try:
        yield engine, load(write_flow(tmp_path / "flows", "st", FLOW))
    finally:
        engine.dispose()


def _claim(engine: Engine, worker: str, at: float, limit: int = 10, flow=None):
    def policy_of(version: str, state: str) -> Policy:
        return flow.states[state].policy if flow is not None else policy(max_restarts=1)

    with engine.begin() as conn:  # as the worker's cycle does: record lost attempts, claim
        lost = leases.recover_lost(conn, policy_of, at=at)
        return leases.claim_batch(conn, worker, LEASE, limit, at=at), lost


def _commit(engine: Engine, worker: str, outcomes, at: float) -> list[int]:
    """Commit as the worker does on SQLite: optimistic first, careful after a rollback."""
    try:
        with engine.begin() as conn:
            lost, _chained = commit.commit_outcomes(conn, worker, outcomes, at=at, optimistic=True)
    except commit.FenceMoved:
        with engine.begin() as conn:
            lost, _chained = commit.commit_outcomes(conn, worker, outcomes, at=at)
    return lost


def _moved(flow, claim, at: float):
    result = AttemptResult("moved", {**claim.data, "by": "me"}, to_state="done")
    return decide(flow, claim, result, claim.data, at)


def test_two_workers_never_claim_the_same_instance(tmp_path: Path, world) -> None:
    engine, flow = world
    with engine.begin() as conn:
        create.create_instances(conn, flow, [{"i": i} for i in range(400)])
    engines = [engine, engine_at(tmp_path)]  # a second engine: a second worker's pool
    claimed: dict[str, list[int]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def work(name: str, eng: Engine) -> None:
        try:
            while True:
                claims, lost = _claim(eng, name, leases.now(), limit=7, flow=flow)
                assert not lost
                if not claims:
                    return
                claimed[name] += [c.id for c in claims]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(n, e)) for n, e in zip("ab", engines, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    a, b = claimed["a"], claimed["b"]
    assert len(set(a)) == len(a) and len(set(b)) == len(b)
    assert not set(a) & set(b), "an instance was claimed by both workers"
    assert len(a) + len(b) == 400
    owners = dict(sql(engine, "SELECT id, locked_by FROM instances"))
    assert all(owners[i] == "a" for i in a) and all(owners[i] == "b" for i in b)
    running = "SELECT count(*) FROM instances WHERE running_attempt = 1 AND fence = 1"
    assert sql(engine, running) == [(400,)]
    assert sql(engine, "SELECT count(*) FROM attempts") == [(0,)], "rows are written at the end"


def test_held_lease_is_not_claimed_again_until_it_expires(any_world) -> None:
    engine, flow = any_world
    iid = new_instance(engine, flow)
    t0 = leases.now()
    [c], _ = _claim(engine, "a", t0)
    assert _claim(engine, "b", t0 + LEASE - 1) == ([], [])
    [c2], lost = _claim(engine, "b", t0 + LEASE + 1, flow=flow)
    assert (c2.id, c2.attempt) == (iid, c.attempt + 1) and c2.fence > c.fence
    assert lost == [leases.Lost(iid, c.attempt, "a", failed=False)]


def test_commit_after_a_command_bumped_the_fence_writes_nothing(any_world) -> None:
    engine, flow = any_world
    iid = new_instance(engine, flow, {"v": 1})
    t0 = leases.now()
    [c], _ = _claim(engine, "a", t0)
    [res] = commands.submit(engine, [iid], "pause")
    assert res.ok
    before = row(engine, iid)
    assert _commit(engine, "a", [_moved(flow, c, t0 + 1)], t0 + 1) == [iid]
    after = row(engine, iid)
    assert (after["state"], after["status"], after["data"]) == ("work", "paused", {"v": 1})
    assert after["fence"] == before["fence"]
    assert (after["locked_by"], after["running_attempt"]) == (None, None), "lock released"
    [att] = attempts_of(engine, iid)
    assert att["outcome"] == "cancelled" and att["to_state"] is None


def test_commit_after_another_worker_took_over_writes_nothing(any_world) -> None:
    engine, flow = any_world
    iid = new_instance(engine, flow, {"v": 1})
    t0 = leases.now()
    [ca], _ = _claim(engine, "a", t0)
    [cb], _ = _claim(engine, "b", t0 + LEASE + 1, flow=flow)  # a's lease expired
    assert _commit(engine, "a", [_moved(flow, ca, t0 + LEASE + 2)], t0 + LEASE + 2) == [iid]
    r = row(engine, iid)
    assert (r["state"], r["locked_by"], r["fence"], r["running_attempt"]) == (
        "work",
        "b",
        cb.fence,
        cb.attempt,
    ), "a stale worker must not touch the new owner's row"
    [first] = attempts_of(engine, iid)
    assert first["outcome"] == "lost", "the new owner recorded it; the stale commit keeps that"
    assert (first["worker"], first["started_at"]) == ("a", t0)
    # the new owner commits normally
    assert _commit(engine, "b", [_moved(flow, cb, t0 + LEASE + 3)], t0 + LEASE + 3) == []
    r = row(engine, iid)
    assert (r["state"], r["status"], r["data"]) == ("done", "completed", {"v": 1, "by": "me"})
    first, second = attempts_of(engine, iid)
    assert (first["outcome"], second["outcome"], second["worker"]) == ("lost", "moved", "b")
    assert (second["started_at"], second["finished_at"]) == (t0 + LEASE + 1, t0 + LEASE + 3)


def test_checkpoint_is_fenced_and_the_restart_starts_from_it(any_world) -> None:
    engine, flow = any_world
    iid = new_instance(engine, flow, {"v": 1})
    t0 = leases.now()
    [ca], _ = _claim(engine, "a", t0)
    with engine.begin() as conn:
        ok = commit.save_checkpoint(conn, "a", ca, {"v": 1, "rows": 10}, {"rows": 10})
    assert ok
    [open_row] = attempts_of(engine, iid)
    assert (open_row["outcome"], open_row["checkpoint"]) == (None, {"rows": 10})
    [cb], _ = _claim(engine, "b", t0 + LEASE + 1, flow=flow)
    assert cb.data == {"v": 1, "rows": 10}, "the restart starts from the last checkpoint"
    with engine.begin() as conn:
        stale = commit.save_checkpoint(conn, "a", ca, {"v": 1, "rows": 99}, {"rows": 99})
    assert not stale
    assert row(engine, iid)["data"] == {"v": 1, "rows": 10}
    [lost] = attempts_of(engine, iid)
    assert (lost["outcome"], lost["checkpoint"]) == ("lost", {"rows": 10}), "kept when lost"


def test_a_checkpointed_attempt_is_completed_not_duplicated(any_world) -> None:
    """The row a checkpoint wrote early is completed by the attempt's end: one row."""
    engine, flow = any_world
    iid = new_instance(engine, flow, {"v": 1})
    t0 = leases.now()
    [c], _ = _claim(engine, "a", t0)
    with engine.begin() as conn:
        assert commit.save_checkpoint(conn, "a", c, {"v": 1, "rows": 5}, {"rows": 5})
    c.data = {"v": 1, "rows": 5}
    assert _commit(engine, "a", [_moved(flow, c, t0 + 2)], t0 + 2) == []
    [a] = attempts_of(engine, iid)
    assert (a["outcome"], a["to_state"], a["checkpoint"]) == ("moved", "done", {"rows": 5})
    assert (a["started_at"], a["finished_at"], a["worker"]) == (t0, t0 + 2, "a")


def test_renew_extends_and_reports_taken_away(world) -> None:
    engine, flow = world
    keep, paused, stolen = (new_instance(engine, flow) for _ in range(3))
    t0 = leases.now()
    claims, _ = _claim(engine, "a", t0)
    held = {c.id: c.fence for c in claims}
    commands.submit(engine, [paused], "pause")
    sql(engine, "UPDATE instances SET locked_until = :t WHERE id = :i", t=t0 - 1, i=stolen)
    _claim(engine, "b", t0 + 1, flow=flow)  # takes `stolen` only: the others are held
    with engine.begin() as conn:
        gone = leases.renew(conn, "a", held, LEASE, at=t0 + 10)
    assert sorted(gone) == sorted([paused, stolen])
    assert row(engine, keep)["locked_until"] == t0 + 10 + LEASE
    assert row(engine, stolen)["locked_by"] == "b"


def test_lost_attempts_count_restarts_until_failed(world) -> None:
    engine, flow = world  # max_restarts: 1
    iid = new_instance(engine, flow)
    t = leases.now()
    [c1], _ = _claim(engine, "w1", t)
    t += LEASE + 1
    [c2], lost = _claim(engine, "w2", t, flow=flow)
    assert lost == [leases.Lost(iid, 1, "w1", failed=False)]
    assert (c2.restarts, c2.state_restarts) == (1, 1)
    r = row(engine, iid)
    assert (r["restarts"], r["state_restarts"], r["running_attempt"]) == (1, 1, c2.attempt)
    a1 = attempts_of(engine, iid)[0]
    assert a1["outcome"] == "lost" and "w1" in a1["error"] and a1["finished_at"] == t
    t += LEASE + 1
    claims, lost = _claim(engine, "w3", t, flow=flow)
    assert claims == [] and lost == [leases.Lost(iid, 2, "w2", failed=True)]
    r = row(engine, iid)
    assert (r["status"], r["restarts"], r["locked_by"], r["running_attempt"]) == (
        "failed",
        2,
        None,
        None,
    )
    assert "restarts spent" in r["last_error"]
    outcomes = [a["outcome"] for a in attempts_of(engine, iid)]
    assert outcomes == ["lost", "lost"], "no attempt is opened for an instance that failed"
    assert r["attempts"] == 2
    # retry resets the state's counters: the instance runs again
    [res] = commands.submit(engine, [iid], "retry")
    assert res.ok
    [c4], lost = _claim(engine, "w4", t + 1, flow=flow)
    assert lost == [] and c4.state_restarts == 0 and c4.restarts == 2


def test_command_closing_an_orphan_attempt_counts_a_restart(world) -> None:
    """A pause after the owner died closes its attempt as ``lost``: one restart."""
    engine, flow = world
    iid = new_instance(engine, flow)
    t0 = leases.now()
    _claim(engine, "dead", t0)
    sql(engine, "UPDATE instances SET locked_until = :t WHERE id = :i", t=t0 - 1, i=iid)
    [res] = commands.submit(engine, [iid], "pause")
    assert res.ok
    r = row(engine, iid)
    assert (r["status"], r["locked_by"], r["running_attempt"]) == ("paused", None, None)
    assert (r["restarts"], r["state_restarts"]) == (1, 1)
    assert attempts_of(engine, iid)[0]["outcome"] == "lost"


def test_record_version_per_database(tmp_path: Path) -> None:
    """Each database gets the version row, even when one process already stored it
    elsewhere (once a process-wide cache skipped it: instances with no stored version)."""
    from runner.flowspec.compiler import compile_source

    flow = compile_source(FLOW.replace("initial", "flow: same\ninitial", 1), "same.yaml")
    one, two = engine_at(tmp_path / "one"), engine_at(tmp_path / "two")
    for eng in (one, two):
        with eng.begin() as conn:
            create.create_instance(conn, flow)
    assert sql(two, "SELECT count(*) FROM flow_versions") == [(1,)]


def test_orphan_on_a_paused_instance_is_not_work(tmp_path: Path) -> None:
    """--exit-when-idle must not wait forever on an attempt whose worker died while the
    instance was paused: only attempts under a valid lease count as running."""
    from sqlalchemy import insert

    from runner.store.db import make_engine
    from runner.store.due import busy_count
    from runner.store.tables import instances

    engine = make_engine(f"sqlite:///{tmp_path / 'o.db'}")
    with engine.begin() as conn:
        conn.execute(
            insert(instances).values(
                flow="f",
                version="v",
                state="s",
                status="paused",
                data={},
                state_errors=[],
                running_attempt=1,
                locked_by="dead",
                locked_until=1.0,
                due_at=None,
            )
        )
        assert busy_count(conn) == 0
        conn.execute(instances.update().values(locked_until=4e9))
        assert busy_count(conn) == 1
        # a dead worker's attempt on a runnable instance is work until recover_lost
        # restarts it: --exit-when-idle must not exit between its lease's expiry and that
        conn.execute(instances.update().values(locked_until=1.0, status="runnable"))
        assert busy_count(conn) == 1


CHAIN_FLOW = """\
initial: a
states:
  a: {exec: [python, -c, "pass"], next: b}
  b: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


def test_a_chained_commit_keeps_the_lock_and_a_dead_worker_loses_nothing(
    tmp_path: Path, any_world
) -> None:
    """A move committed with ``chain`` keeps the instance locked and runnable, due at its
    old (past) time, and names the next attempt as running; when that worker dies, the
    next cycle after the lease records that attempt as lost and runs the new state."""
    engine = any_world[0]
    flow = load(write_flow(tmp_path / "flows", "ch", CHAIN_FLOW))
    iid = new_instance(engine, flow, {"v": 1})
    due_before = row(engine, iid)["due_at"]
    t0 = leases.now()
    [c], _ = _claim(engine, "a", t0)
    outcome = decide(flow, c, AttemptResult("moved", {"v": 2}, to_state="b"), c.data, t0 + 1)
    outcome.chain = True
    with engine.begin() as conn:
        lost, [nxt] = commit.commit_outcomes(conn, "a", [outcome], at=t0 + 1, lease=LEASE)
    assert lost == []
    assert (nxt.id, nxt.state, nxt.attempt, nxt.fence, nxt.data) == (iid, "b", 2, c.fence, {"v": 2})
    r = row(engine, iid)
    assert (r["state"], r["status"], r["locked_by"], r["running_attempt"]) == (
        "b",
        "runnable",
        "a",
        2,
    )
    assert r["due_at"] == due_before, "a chained commit leaves the claim index alone"
    assert r["locked_until"] == t0 + 1 + LEASE, "the lease is renewed"
    assert r["data"] == {"v": 2}
    assert r["state_attempted"] == t0 + 1, "the next attempt started at the commit"
    [first] = attempts_of(engine, iid)
    assert (first["outcome"], first["to_state"]) == ("moved", "b")
    # worker a dies: nobody may take the instance before its lease ends, then b does
    assert _claim(engine, "b", t0 + LEASE) == ([], [])
    [cb], lost = _claim(engine, "b", t0 + 2 + LEASE, flow=flow)
    assert lost == [leases.Lost(iid, 2, "a", failed=False)]
    assert (cb.id, cb.state, cb.attempt, cb.restarts) == (iid, "b", 3, 1)
    first, second = attempts_of(engine, iid)
    assert [first["outcome"], second["outcome"]] == ["moved", "lost"]
    assert (second["attempt"], second["state"], second["started_at"]) == (2, "b", t0 + 1)


def test_one_batch_commits_the_held_chains_and_refuses_the_taken(tmp_path: Path, any_world) -> None:
    """One commit of a batch that mixes outcomes releasing their instance, a chained one
    and one whose instance a command took away: the held ones are written with their
    attempt rows (on PostgreSQL in one statement), the taken one writes nothing but its
    attempt, closed as cancelled."""
    engine = any_world[0]
    flow = load(write_flow(tmp_path / "flows", "mx", CHAIN_FLOW))
    ids = [new_instance(engine, flow, {"n": n}) for n in range(4)]
    t0 = leases.now()
    claims, _ = _claim(engine, "a", t0)
    by_id = {c.id: c for c in claims}
    [res] = commands.submit(engine, [ids[3]], "pause")
    assert res.ok
    outcomes = []
    for iid in ids:
        c = by_id[iid]
        result = AttemptResult("moved", {"n": c.data["n"], "by": "a"}, to_state="b")
        outcomes.append(decide(flow, c, result, c.data, t0 + 1))
    outcomes[0].chain = True
    with engine.begin() as conn:
        lost, chained = commit.commit_outcomes(conn, "a", outcomes, at=t0 + 1, lease=LEASE)
    assert lost == [ids[3]]
    assert [(c.id, c.state, c.attempt) for c in chained] == [(ids[0], "b", 2)]
    r0, r1, r3 = row(engine, ids[0]), row(engine, ids[1]), row(engine, ids[3])
    assert (r0["locked_by"], r0["running_attempt"], r0["data"]) == ("a", 2, {"n": 0, "by": "a"})
    assert (r1["state"], r1["locked_by"], r1["running_attempt"]) == ("b", None, None)
    assert (r3["state"], r3["status"], r3["data"]) == ("a", "paused", {"n": 3})
    for iid in ids[:3]:
        [att] = attempts_of(engine, iid)
        assert (att["outcome"], att["to_state"], att["worker"]) == ("moved", "b", "a")
        assert (att["started_at"], att["finished_at"]) == (t0, t0 + 1)
    [att] = attempts_of(engine, ids[3])
    assert (att["outcome"], att["to_state"]) == ("cancelled", None)


def test_an_optimistic_commit_that_meets_a_moved_fence_writes_nothing(world) -> None:
    """Without reading the fences first, a lost claim is noticed by the row counts and
    the whole batch is refused (the caller rolls back and commits the careful way)."""
    engine, flow = world
    kept_id = new_instance(engine, flow, {"v": 1})
    paused_id = new_instance(engine, flow, {"v": 2})
    t0 = leases.now()
    claims, _ = _claim(engine, "a", t0)
    by_id = {c.id: c for c in claims}
    [res] = commands.submit(engine, [paused_id], "pause")
    assert res.ok
    outcomes = [_moved(flow, by_id[i], t0 + 1) for i in (kept_id, paused_id)]
    with pytest.raises(commit.FenceMoved):
        with engine.begin() as conn:
            commit.commit_outcomes(conn, "a", outcomes, at=t0 + 1, optimistic=True)
    assert row(engine, kept_id)["state"] == "work", "rolled back: nothing written"
    assert attempts_of(engine, kept_id) == [], "rolled back: no attempt row either"
    assert _commit(engine, "a", outcomes, t0 + 1) == [paused_id]
    assert (row(engine, kept_id)["state"], row(engine, paused_id)["status"]) == ("done", "paused")
    assert [a["outcome"] for a in attempts_of(engine, kept_id)] == ["moved"]
    assert [a["outcome"] for a in attempts_of(engine, paused_id)] == ["cancelled"]


def test_a_driver_error_in_a_hot_statement_is_a_dbapi_error(world) -> None:
    """Hot statements bypass SQLAlchemy's execution on SQLite; a driver error must still
    arrive as SQLAlchemy's DBAPIError (what the worker's retry and fallback look for)."""
    from sqlalchemy.exc import DBAPIError, IntegrityError

    from runner.store.hot import hot_for
    from runner.store.rows import attempt_row

    engine, flow = world
    iid = new_instance(engine, flow)
    [c] = _claim(engine, "a", leases.now())[0]
    c.state = None  # type: ignore[assignment] - a NOT NULL column
    with pytest.raises(IntegrityError) as caught:
        with engine.begin() as conn:
            hot_for(conn).close_attempts.executemany(conn, [attempt_row(c, "a", 1.0, "moved")])
    assert isinstance(caught.value, DBAPIError) and "NOT NULL" in str(caught.value.orig)
    assert iid == c.id


def test_show_names_the_running_attempt_from_the_instance_row(world) -> None:
    """No attempt row exists while an attempt runs: ``show`` builds it from the instance
    (number, state, worker, start); a checkpointed attempt's early row is not doubled."""
    from runner.ops.detail import get_instance

    engine, flow = world
    iid = new_instance(engine, flow, {"v": 1})
    t0 = leases.now()
    [c], _ = _claim(engine, "w1", t0)
    [running] = get_instance(engine, iid)["history"]
    assert (running["attempt"], running["state"], running["worker"]) == (1, "work", "w1")
    assert running["outcome"] is None and running["finished_at"] is None
    assert running["started_at"] is not None
    with engine.begin() as conn:
        assert commit.save_checkpoint(conn, "w1", c, {"v": 2}, {"v": 2})
    [early] = get_instance(engine, iid)["history"]
    assert (early["attempt"], early["outcome"], early["checkpoint"]) == (1, None, {"v": 2})
    c.data = {"v": 2}
    _commit(engine, "w1", [_moved(flow, c, t0 + 1)], t0 + 1)
    [done] = get_instance(engine, iid)["history"]
    assert (done["attempt"], done["outcome"], done["to_state"]) == (1, "moved", "done")


@pytest.mark.postgres
def test_recover_lost_records_each_attempt_once_across_workers(pg_url: str, tmp_path) -> None:
    """Two workers looking for lost attempts at once on PostgreSQL: the rows one locks
    are skipped by the other (SKIP LOCKED), and once recorded they are not found again."""
    from runner.store.db import make_engine

    flow = load(write_flow(tmp_path / "flows", "st", FLOW))
    engines = [make_engine(pg_url), make_engine(pg_url)]
    try:
        ids = [new_instance(engines[0], flow) for _ in range(3)]
        t0 = leases.now()
        with engines[0].begin() as conn:
            leases.claim_batch(conn, "dead", LEASE, 10, at=t0)
        later = t0 + LEASE + 1
        with engines[0].begin() as first:
            found = leases.recover_lost(first, lambda v, s: policy(1), at=later)
            assert sorted(lost.instance_id for lost in found) == ids
            with engines[1].begin() as second:
                assert leases.recover_lost(second, lambda v, s: policy(1), at=later) == []
        with engines[1].begin() as second:
            assert leases.recover_lost(second, lambda v, s: policy(1), at=later) == []
            assert len(leases.claim_batch(second, "b", LEASE, 10, at=later)) == 3
        lost = sql(engines[0], "SELECT count(*) FROM attempts WHERE outcome = 'lost'")
        assert lost == [(3,)]
        assert sql(engines[0], "SELECT sum(restarts) FROM instances") == [(3,)]
    finally:
        for e in engines:
            e.dispose()


def test_a_claimed_sleeping_instance_is_runnable_again(any_world) -> None:
    """The claim leaves ``status`` alone (an indexed column) except on the instances it
    wakes: a ``sleeping`` one whose backoff is over runs, so it reads ``runnable``."""
    engine, flow = any_world
    asleep, awake, later = (new_instance(engine, flow) for _ in range(3))
    t0 = leases.now()
    sql(
        engine,
        "UPDATE instances SET status = 'sleeping', due_at = :t WHERE id = :i",
        t=t0 - 1,
        i=asleep,
    )
    sql(
        engine,
        "UPDATE instances SET status = 'sleeping', due_at = :t WHERE id = :i",
        t=t0 + 60,
        i=later,
    )
    claims, _ = _claim(engine, "a", t0)
    assert sorted(c.id for c in claims) == [asleep, awake]
    assert [row(engine, i)["status"] for i in (asleep, awake, later)] == [
        "runnable",
        "runnable",
        "sleeping",
    ]


def test_a_claim_takes_the_oldest_due_first_across_statuses(any_world) -> None:
    """Oldest due first, whatever the claimable status (PostgreSQL reads each status in
    ``due_at`` order and merges them): the limit leaves the most recently due behind."""
    engine, flow = any_world
    ids = [new_instance(engine, flow) for _ in range(4)]
    t0 = leases.now()
    due = {ids[0]: t0 - 5, ids[1]: t0 - 10, ids[2]: t0 - 1, ids[3]: t0 - 7}
    for iid, at in due.items():
        status = "sleeping" if iid in (ids[1], ids[3]) else "runnable"
        sql(
            engine,
            "UPDATE instances SET status = :s, due_at = :t WHERE id = :i",
            s=status,
            t=at,
            i=iid,
        )
    claims, _ = _claim(engine, "a", t0, limit=3)
    assert sorted(c.id for c in claims) == sorted([ids[0], ids[1], ids[3]])
    [c], _ = _claim(engine, "b", t0, limit=3)
    assert c.id == ids[2]


def _plan(conn, prepared, params: dict) -> str:
    """The plan PostgreSQL makes for a hot statement (``prepared.Prepared``) with ``params``."""
    rows = conn.exec_driver_sql("EXPLAIN " + prepared.sql, {**prepared.defaults, **params})
    return "\n".join(rows.scalars().all())


@pytest.mark.postgres
def test_the_cycle_plans_by_index_without_statistics(pg_url: str, tmp_path) -> None:
    """A new table (never analyzed) with a backlog, the worker having held and released
    many rows (their dead versions still indexed): the claim reads the oldest due rows
    in index order and the batch commit finds its rows by primary key, never a scan of
    every due row, of ``ix_instances_locked_by`` or of the table (``leases.by_index``);
    the setting ends with the transaction."""
    from runner.store.batch import batch_for, batch_rows
    from runner.store.hot import hot_for

    flow = load(write_flow(tmp_path / "flows", "st", FLOW))
    engine = make_engine(pg_url)
    try:
        with engine.begin() as conn:
            create.create_instances(conn, flow, [{"i": i} for i in range(5000)])
        t0 = leases.now()
        claims: list = []
        for k in range(4):  # as a worker's cycles do: commit the last batch, claim the next
            at = t0 + k
            with engine.begin() as conn:
                commit.commit_outcomes(conn, "w", [_moved(flow, c, at) for c in claims], at=at)
                claims = leases.claim_batch(conn, "w", LEASE, 256, at=at)
        at = t0 + 5
        ended = [_moved(flow, c, at) for c in claims]
        released, kept, _chained, finished = batch_rows(ended, "w", at)
        commit_params = {
            "w": "w",
            "b_at": at,
            "b_until": at + LEASE,
            **{
                f"{p}_rows": json.dumps(r)
                for p, r in zip("rka", (released, kept, finished), strict=True)
            },
        }
        claim_params = {"at": at, "n": 256, "w": "w", "until": at + LEASE, "labels": "{}"}
        with engine.begin() as conn:
            leases.by_index(conn)
            claim = _plan(conn, hot_for(conn).claim, claim_params)
            batch = _plan(conn, batch_for(conn).commit_all, commit_params)
        assert "ix_instances_claim" in claim and "Bitmap" not in claim, claim
        assert "Seq Scan on instances" not in claim, claim
        assert "instances_pkey" in batch and "Seq Scan on instances" not in batch, batch
        assert "ix_instances_locked_by" not in batch and "Bitmap" not in batch, batch
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW enable_seqscan").scalar() == "on"
    finally:
        engine.dispose()
