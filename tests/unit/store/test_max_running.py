"""Flow limits (``max_running``, ``on_limit``; ``runner.store.flow_limits``): the spec and
its checks, the limit kept inside the claim (per key), waiters woken when an attempt
ends, a rule's start skipped under the limit, explain's text; on a real SQLite file and
on the real PostgreSQL server. Times are passed explicitly (no sleeps)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.errors import FlowErrors
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.compiler import compile_source
from runner.ops.forecast import pool_wait
from runner.ops.pools import read_pools
from runner.sensors.rule_actions import Planned, act
from runner.store import leases, pools
from runner.store.db import make_engine
from runner.store.limit_names import describe, limit_name
from tests.support.fault import engine_at, load, new_instance, sql, write_flow

FLOW = """\
initial: run
max_running: MAX
on_limit: skip
states:
  run: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""

LEASE = 30.0
T0 = 2_000_000_000.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        eng = engine_at(tmp_path)
    else:
        eng = make_engine(request.getfixturevalue("pg_url"))
    try:
        yield eng
    finally:
        eng.dispose()


def _flow(tmp: Path, limit: str = "1") -> CompiledFlow:
    return load(write_flow(tmp / "flows", "nightly", FLOW.replace("MAX", limit)))


def _claim(engine: Engine, worker: str, at: float, limit: int = 10):
    with engine.begin() as conn:
        return leases.claim_batch(conn, worker, LEASE, limit, at=at)


def _end(engine: Engine, claim, at: float) -> None:
    """The attempt of ``claim`` ended (as a commit leaves the row) and its limit given back."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE instances SET running_attempt = NULL, locked_by = NULL,"
            f" status = 'completed', due_at = NULL WHERE id = {claim.id}"
        )
        pools.release(conn, [claim], at)


def _waiting(engine: Engine) -> list[tuple[int, str]]:
    return sql(engine, "SELECT id, waiting_for FROM instances WHERE waiting_for IS NOT NULL")


def test_spec_forms_and_checks() -> None:
    base = FLOW.replace("on_limit: skip\n", "")
    flow = compile_source("flow: f\n" + base.replace("MAX", "3"), "f.yaml")
    assert (flow.max_running, flow.on_limit) == ((3, None), "queue")
    keyed = compile_source(
        "flow: f\n" + FLOW.replace("MAX", '{limit: 1, key: "{data.customer}"}'), "f.yaml"
    )
    assert (keyed.max_running, keyed.on_limit) == ((1, "{data.customer}"), "skip")
    assert (
        compile_source("flow: f\n" + base.replace("max_running: MAX\n", ""), "f.yaml").max_running
        is None
    )
    bad = {
        "max_running: 0": "max_running",
        'max_running: {limit: 1, key: "{event.x}"}': "expected {data.",
        "max_running: 1\non_limit: later": "'queue' or 'skip'",
        "on_limit: skip": "on_limit needs max_running",
    }
    for text, message in bad.items():
        body = base.replace("max_running: MAX", text)
        with pytest.raises(FlowErrors, match=message):
            compile_source("flow: f\n" + body, "f.yaml")


def test_limit_names() -> None:
    assert limit_name("nightly", None, {}) == "flow:nightly"
    assert limit_name("f", "{data.c}", {"c": "acme"}) == "flow:f:acme"
    assert limit_name("f", "{data.c}", {}) == "flow:f:"  # missing: empty
    assert describe("flow:nightly") == "max_running of flow nightly"
    assert describe("flow:f:acme") == "max_running of flow f (key acme)"


def test_claim_keeps_max_running_and_wakes_the_oldest_waiter(engine, tmp_path) -> None:
    flow = _flow(tmp_path)
    ids = [new_instance(engine, flow) for _ in range(3)]
    got = _claim(engine, "w1", T0)
    assert [c.id for c in got] == ids[:1] and got[0].limit == "flow:nightly"
    assert _waiting(engine) == [(ids[1], "flow:nightly"), (ids[2], "flow:nightly")]
    assert _claim(engine, "w2", T0 + 1) == []  # the waiters are not due
    (limit,) = [p for p in read_pools(engine, now=T0 + 1) if p["name"] == "flow:nightly"]
    assert (limit["slots"], limit["in_use"], limit["holders"], limit["waiting"]) == (
        1,
        1,
        ids[:1],
        2,
    )
    text, _ = pool_wait("flow:nightly", limit)
    assert text.startswith(f"waiting for max_running of flow nightly: 1/1 running: {ids[0]}")
    _end(engine, got[0], T0 + 2)
    assert [w[0] for w in _waiting(engine)] == ids[2:]
    again = _claim(engine, "w2", T0 + 3)
    assert [c.id for c in again] == [ids[1]]


def test_a_lapsed_lease_frees_the_limit(engine, tmp_path) -> None:
    flow = _flow(tmp_path, "2")
    ids = [new_instance(engine, flow) for _ in range(3)]
    assert len(_claim(engine, "w1", T0)) == 2
    with engine.begin() as conn:
        assert pools.sweep(conn, T0 + LEASE - 1) == 0
    with engine.begin() as conn:
        assert pools.sweep(conn, T0 + LEASE + 1) == 1
    assert _waiting(engine) == []
    assert ids[2] in [c.id for c in _claim(engine, "w2", T0 + LEASE + 2)]


def test_keyed_limit_lets_different_keys_run_together(engine, tmp_path) -> None:
    flow = _flow(tmp_path, '{limit: 1, key: "{data.customer}"}')
    a1, a2, b1 = (new_instance(engine, flow, {"customer": c}) for c in ("acme", "acme", "bolt"))
    got = _claim(engine, "w1", T0)
    assert sorted(c.id for c in got) == [a1, b1]
    assert {c.limit for c in got} == {"flow:nightly:acme", "flow:nightly:bolt"}
    assert _waiting(engine) == [(a2, "flow:nightly:acme")]


def test_skip_refuses_a_rules_start_at_the_limit(engine, tmp_path) -> None:
    flow = _flow(tmp_path, '{limit: 1, key: "{data.customer}"}')
    planned = Planned("start", flow.name, data={"customer": "acme"}, target=flow)
    with engine.begin() as conn:
        text, n = act(conn, planned, 1, "rule:t#1")
    assert n == 1 and text.startswith("started nightly instance")
    first = int(text.rsplit(" ", 1)[1])
    with engine.begin() as conn:  # live (due, not claimed yet): skipped
        text, n = act(conn, planned, 2, "rule:t#1")
    assert n == 0
    assert text == (
        f"skipped start of nightly: max_running of flow nightly (key acme): 1/1 live: {first}"
    )
    other = Planned("start", flow.name, data={"customer": "bolt"}, target=flow)
    with engine.begin() as conn:  # another key: started
        assert act(conn, other, 3, "rule:t#1")[1] == 1
    (got,) = [c for c in _claim(engine, "w1", T0) if c.id == first]
    _end(engine, got, T0 + 1)
    with engine.begin() as conn:  # the first one ended: started again
        assert act(conn, planned, 4, "rule:t#1")[1] == 1
    assert sql(engine, "SELECT count(*) FROM instances")[0][0] == 3
