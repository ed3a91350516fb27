"""The status lifecycle (design §2), row by row, allowed and refused.

Operator commands go through ``runner.ops.commands.submit`` on a real SQLite file: the status
is set on a real instance row, the command submitted, and the row, the fence and the
``commands`` audit row checked. Engine-internal events (sleep, wake, backoff, exhaust,
complete, fail) are checked through ``runner.lifecycle.check``. The expected tables below
are written out from the design document, not derived from ``lifecycle.TABLE``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner import lifecycle
from runner.errors import IllegalMove, UserError
from runner.lifecycle import STATUSES
from runner.ops import commands
from tests.support.fault import engine_at, load, new_instance, row, sql, write_flow

FLOW = """\
initial: wait
states:
  wait: {external: true, on: {go: work, finish: done}}
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""

#: command -> {from status: to status}; every other status refuses (design §2).
OPERATOR = {
    "pause": {"runnable": "paused", "sleeping": "paused"},
    "resume": {"paused": "runnable", "sleeping": "runnable"},
    "kill": {"runnable": "killed", "sleeping": "killed", "paused": "killed"},
    "retry": {"failed": "runnable"},
    # an `on:` event moves the instance; a paused one moves but stays paused
    "send": {"runnable": "runnable", "sleeping": "runnable", "paused": "paused"},
    # Metafora's Sleep and Run: a sleep may also move a sleeping one's wake time
    "sleep": {"runnable": "sleeping", "paused": "sleeping", "sleeping": "sleeping"},
    "wake": {"sleeping": "runnable"},
}

#: engine events -> {from: to} (design §2 and runner/lifecycle.py's comments).
INTERNAL = {
    "backoff": {"runnable": "sleeping"},
    "exhaust_fail": {"runnable": "failed"},
    "exhaust_pause": {"runnable": "paused"},
    "complete": {"runnable": "completed"},
    "expire": {"runnable": "failed", "sleeping": "failed", "paused": "failed"},  # deadline
    "fail": {"runnable": "failed"},
}


def test_table_covers_every_event() -> None:
    assert set(lifecycle.events()) == set(OPERATOR) | set(INTERNAL)
    assert set(lifecycle.OPERATOR_COMMANDS) == set(OPERATOR)


@pytest.fixture
def world(tmp_path: Path) -> tuple[Engine, object]:
    """A real SQLite file with the flow's version stored."""
    flow = load(write_flow(tmp_path / "flows", "lc", FLOW))
    engine = engine_at(tmp_path)
    return engine, flow


def _at(engine: Engine, flow, status: str, state: str = "wait") -> int:
    iid = new_instance(engine, flow)
    sql(
        engine,
        "UPDATE instances SET status = :s, state = :st, due_at = 123.0, "
        "state_errors = '[1.0, 2.0]', state_restarts = 2 WHERE id = :i",
        s=status,
        st=state,
        i=iid,
    )
    return iid


def _audit(engine: Engine, iid: int) -> list[tuple]:
    return sql(
        engine,
        "SELECT command, status, result FROM commands WHERE instance_id = :i ORDER BY id",
        i=iid,
    )


CASES = [(cmd, status) for cmd in OPERATOR for status in STATUSES]


@pytest.mark.parametrize(("command", "status"), CASES, ids=[f"{c}-{s}" for c, s in CASES])
def test_operator_command(world, command: str, status: str) -> None:
    engine, flow = world
    iid = _at(engine, flow, status, "work" if command == "sleep" else "wait")
    before = row(engine, iid)
    until = 500.0 if command == "sleep" else None
    event = "go" if command == "send" else None
    [res] = commands.submit(engine, [iid], command, event=event, until=until)
    after = row(engine, iid)
    expected = OPERATOR[command].get(status)
    if expected is None:
        assert not res.ok
        assert res.message == f"cannot {command}: instance {iid} is {status}"
        assert after["status"] == status
        assert after["fence"] == before["fence"], "a refused command must not bump the fence"
        assert after["state"] == before["state"]
        assert _audit(engine, iid) == [(command, "refused", res.message)]
        return
    assert res.ok, res.message
    assert after["status"] == expected
    assert after["fence"] == before["fence"] + 1, "an applied command bumps the fence"
    assert _audit(engine, iid) == [(command, "applied", res.message)]
    if command == "send":
        assert after["state"] == "work"
        assert after["state_errors"] == [] and after["state_restarts"] == 0
    if command == "retry":
        assert after["state_errors"] == [] and after["state_restarts"] == 0
    if command == "kill":
        assert after["due_at"] is None
    if command == "sleep":
        assert (after["state"], after["due_at"]) == ("work", 500.0)
        assert after["state_errors"] == [1.0, 2.0] and after["state_restarts"] == 2
    if command == "wake":
        assert after["due_at"] > 123.0


@pytest.mark.parametrize(
    ("event", "status"),
    [(e, s) for e in INTERNAL for s in STATUSES],
    ids=[f"{e}-{s}" for e in INTERNAL for s in STATUSES],
)
def test_internal_event(event: str, status: str) -> None:
    expected = INTERNAL[event].get(status)
    if expected is None:
        assert not lifecycle.allowed(status, event)
        with pytest.raises(IllegalMove, match=rf"^cannot {event}: instance 42 is {status}$"):
            lifecycle.check(status, event, 42)
    else:
        assert lifecycle.allowed(status, event)
        assert lifecycle.check(status, event, 42) == expected


def test_refusal_message_example(world) -> None:
    engine, flow = world
    iid = _at(engine, flow, "completed")
    [res] = commands.submit(engine, [iid], "resume")
    assert res.message == f"cannot resume: instance {iid} is completed"


def test_resume_schedules_now_and_external_state_waits(world) -> None:
    engine, flow = world
    work = _at(engine, flow, "paused", state="work")
    wait = _at(engine, flow, "paused", state="wait")
    commands.submit(engine, [work, wait], "resume")
    assert row(engine, work)["due_at"] > 123.0  # due now, not at the stale due time
    assert row(engine, wait)["due_at"] is None  # an external state has no handler to run


def test_send_to_terminal_completes(world) -> None:
    engine, flow = world
    iid = _at(engine, flow, "paused")
    [res] = commands.submit(engine, [iid], "send", event="finish")
    assert res.ok
    r = row(engine, iid)
    assert (r["state"], r["status"], r["due_at"]) == ("done", "completed", None)


def test_send_unknown_event_is_refused_with_the_edges(world) -> None:
    engine, flow = world
    iid = _at(engine, flow, "runnable")
    [res] = commands.submit(engine, [iid], "send", event="nope")
    assert not res.ok
    assert "nope" in res.message
    assert row(engine, iid)["state"] == "wait"
    assert commands.allowed_events(engine, iid) == ["go", "finish"] or sorted(
        commands.allowed_events(engine, iid)
    ) == ["finish", "go"]


def test_retry_resets_the_state_counters_only(world) -> None:
    engine, flow = world
    iid = _at(engine, flow, "failed", state="work")
    sql(engine, "UPDATE instances SET errors = 9, restarts = 4 WHERE id = :i", i=iid)
    [res] = commands.submit(engine, [iid], "retry")
    assert res.ok
    r = row(engine, iid)
    assert (r["status"], r["state_errors"], r["state_restarts"]) == ("runnable", [], 0)
    assert (r["errors"], r["restarts"]) == (9, 4), "lifetime totals are history, not reset"
    assert r["due_at"] is not None


def test_unknown_id_and_unknown_command(world) -> None:
    engine, flow = world
    iid = _at(engine, flow, "runnable")
    results = commands.submit(engine, [999_999, iid], "pause")
    assert [(r.ok, r.message) for r in results] == [
        (False, "no instance 999999"),
        (True, f"instance {iid}: runnable -> paused"),
    ]
    with pytest.raises(UserError) as err:
        commands.submit(engine, [iid], "complete")
    assert err.value.exit_code == 2
