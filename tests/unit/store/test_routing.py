"""Routing by label (``runs_on``, ``--labels``): the label parsing, the requirement a
state resolves, the claim's filter inside its statement on a real SQLite file and on the
real PostgreSQL server, a move writing the next state's requirement, the chain stopped
where the requirement changes, and ``routing_timeout`` moving instances no live worker
matches. Times are passed explicitly (no sleeps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, update

from runner import labels
from runner.engine.outcomes import decide
from runner.errors import FlowErrors
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.compiler import compile_source
from runner.handlers.attempt import AttemptResult
from runner.store import commit, due, heartbeat, leases, routing
from runner.store.create import create_instance
from runner.store.tables import instances, workers
from tests.support.fault import either_world, sql

FLOW = """\
initial: a
defaults:
  runs_on: {site: paris}
states:
  a: {exec: [python, -c, "pass"], next: b, runs_on: {site: "", gpu: "1"}}
  b: {exec: [python, -c, "pass"], next: c, runs_on: {host: "{event.host}"}}
  c: {exec: [python, -c, "pass"], next: d, runs_on: {site: "{data.site}"},
      routing_timeout: {after: 10m, then: d}}
  d: {exec: [python, -c, "pass"], next: e, runs_on: {site: ""}}
  e: {exec: [python, -c, "pass"], next: done, runs_on: {gpu: "2"}, routing_timeout: 1m}
  done: {terminal: true}
"""

LEASE = 30.0
T0 = 2_000_000_000.0
GPU = labels.canonical({"gpu": "1", "host": "h1"})
PLAIN = labels.canonical({"host": "h2"})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request, tmp_path: Path) -> tuple[Engine, CompiledFlow]:
    made = either_world(request, tmp_path, "ro", FLOW)
    request.addfinalizer(made[0].dispose)
    return made


def _claim(engine: Engine, who: str, mine: str | None, at: float = T0):
    with engine.begin() as conn:
        return leases.claim_batch(conn, who, LEASE, 10, at=at, labels=mine)


def test_parse_labels_adds_host_and_refuses_mistakes() -> None:
    assert labels.parse("gpu=1, site=paris", host="h") == {"gpu": "1", "site": "paris", "host": "h"}
    assert labels.parse("host=x", host="h") == {"host": "x"}
    assert labels.parse("", host="h") == {"host": "h"}
    for bad, why in [("gpu", "no '='"), ("1x=2", "bad label name"), ("a=1,a=2", "twice")]:
        with pytest.raises(ValueError, match=why):
            labels.parse(bad)
    assert labels.canonical({"b": "2", "a": "1"}) == '{"a":"1","b":"2"}'
    assert labels.covers({"a": "1", "b": "2"}, {"a": "1"})
    assert not labels.covers({"a": "1"}, {"a": "2"})
    assert labels.resolve({"h": "{event.host}"}, {}, None) == '{"h":""}'  # never dropped


def test_spec_merges_defaults_and_checks_values(tmp_path: Path) -> None:
    flow = compile_source(FLOW, str(tmp_path / "ro.yaml"), imports=False)
    assert flow.states["a"].routing.runs_on == {"gpu": "1"}
    assert flow.states["b"].routing.runs_on == {"site": "paris", "host": "{event.host}"}
    assert flow.states["d"].routing.runs_on is None
    assert flow.states["c"].routing.after == 600.0 and flow.states["c"].routing.then == "d"
    assert flow.route_fields == ("host",)
    bad = FLOW.replace('gpu: "1"', "gpu: 1").replace("then: d", "then: nowhere")
    with pytest.raises(FlowErrors) as err:
        compile_source(bad, str(tmp_path / "ro.yaml"), imports=False)
    text = str(err.value)
    assert "ro.yaml:5:" in text and "string" in text  # a number: positioned
    assert "routing_timeout's then 'nowhere'" in text


def test_claim_takes_only_what_the_labels_cover(world) -> None:
    engine, flow = world
    with engine.begin() as conn:
        gpu = create_instance(conn, flow, {}, at=T0 - 5)  # state a: gpu=1
        plain = create_instance(conn, flow, {}, at=T0 - 4)
        conn.execute(update(instances).where(instances.c.id == plain).values(runs_on=None))
    assert [c.id for c in _claim(engine, "w2", PLAIN)] == [plain]
    assert _claim(engine, "w0", None) == []  # no labels: nothing routed
    claims = _claim(engine, "w1", GPU)
    assert [c.id for c in claims] == [gpu] and claims[0].runs_on == '{"gpu":"1"}'
    with engine.connect() as conn:
        assert not due.has_due(conn, T0, PLAIN)


def test_a_move_writes_the_next_requirement_and_is_not_chained(world) -> None:
    engine, flow = world
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {"site": "lyon"}, at=T0 - 5, event={"host": "h9"})
    [claim] = _claim(engine, "w1", GPU)
    assert claim.route_event == {"host": "h9"}
    outcome = decide(flow, claim, AttemptResult("moved", claim.data, to_state="b"), {}, T0)
    assert not claim.keeps_route(outcome.values)
    with engine.begin() as conn:
        commit.commit_outcomes(conn, "w1", [outcome], at=T0)
    stored = sql(engine, f"SELECT runs_on FROM instances WHERE id = {iid}")[0][0]
    assert labels.decode(stored) == {"host": "h9", "site": "paris"}
    assert _claim(engine, "w1", GPU, T0 + 1) == []
    h9 = labels.canonical({"host": "h9", "site": "paris", "x": "y"})
    assert [c.id for c in _claim(engine, "w9", h9, T0 + 1)] == [iid]


def test_routing_timeout_moves_what_no_live_worker_matches(world) -> None:
    engine, flow = world
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {"site": "rome"}, at=T0)
        conn.execute(
            update(instances)
            .where(instances.c.id == iid)
            .values(state="c", runs_on=labels.canonical({"site": "rome"}))
        )
    heartbeat.register(engine, "w-rome", 2.0, labels.canonical({"site": "rome", "host": "r"}))
    with engine.begin() as conn:  # alive at T0 + 100: nothing moves
        conn.execute(update(workers).values(heartbeat_at=T0 + 100))
        assert routing.sweep(conn, T0 + 700) == 0  # alive until T0 + 106 ... < 706
    with engine.begin() as conn:
        assert routing.sweep(conn, T0 + 105) == 0  # alive: just queued
        assert routing.sweep(conn, T0 + 700) == 0  # gone at T0 + 106: 10m not over
        assert routing.sweep(conn, T0 + 707) == 1
    state, status, runs_on = sql(
        engine, f"SELECT state, status, runs_on FROM instances WHERE id = {iid}"
    )[0]
    assert (state, status, runs_on) == ("d", "runnable", None)
    [cmd] = sql(engine, f"SELECT command, source, result FROM commands WHERE instance_id = {iid}")
    assert cmd[0] == "route" and cmd[1] == "routing" and "site=rome" in cmd[2]


def test_routing_timeout_fails_by_default_and_checks_are_positioned(world, tmp_path) -> None:
    engine, flow = world
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {}, at=T0)
        gpu2 = labels.canonical({"gpu": "2"})
        conn.execute(update(instances).where(instances.c.id == iid).values(state="e", runs_on=gpu2))
        assert routing.sweep(conn, T0 + 59) == 0
        assert routing.sweep(conn, T0 + 61) == 1
    [(status, error)] = sql(engine, f"SELECT status, last_error FROM instances WHERE id = {iid}")
    assert status == "failed" and "no live worker with gpu=2 (never): failed" in error
    bad = FLOW.replace("defaults:\n  runs_on: {site: paris}", "defaults: {}").replace(
        "  done: {terminal: true}", "  done: {terminal: true, runs_on: {a: b}}"
    )
    bad += "sensors:\n  s: {every: 1m, runs_on: {site: '{data.x}'}}\n"
    with pytest.raises(FlowErrors) as err:
        compile_source(bad, str(tmp_path / "ro.yaml"), imports=False)
    text = str(err.value)
    assert "ro.yaml:10:26: runs_on applies to exec and call states only" in text, text
    assert "a sensor's runs_on takes plain values" in text, text
