"""Sleep until at the unit level: the control line, the ``call``
handler's ``ctx.sleep_until`` / returned ``Sleep``, and ``decide``'s sleeping outcome."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner import control_channel
from runner.control import Context, Sleep
from runner.engine.outcomes import decide
from runner.handlers.attempt import AttemptResult, Limits, slept
from runner.handlers.call_handler import _returned
from runner.store.rows import Claim
from tests.support.fault import load, write_flow

AT = 1_800_000_000.0
FLOW = """\
initial: work
states:
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


def test_control_line_takes_an_iso_time_or_a_duration() -> None:
    assert control_channel.parse("sleep 2026-12-01T09:00:00Z") == (
        "sleep",
        datetime(2026, 12, 1, 9, tzinfo=UTC).timestamp(),
    )
    assert control_channel.parse("sleep 2026-12-01T09:00:00") == control_channel.parse(
        "sleep 2026-12-01T09:00Z"
    )
    assert (
        control_channel.parse("sleep 2026-12-01T10:00:00+01:00")[1]
        == datetime(2026, 12, 1, 9, tzinfo=UTC).timestamp()
    )
    assert control_channel.wake_time("15m", now=AT) == AT + 900
    with pytest.raises(ValueError, match="bad time"):
        control_channel.parse("sleep tomorrow")
    with pytest.raises(ValueError):
        control_channel.parse("sleep")


def test_python_helper_outside_flowrun_is_a_noop_but_checks_its_argument() -> None:
    assert control_channel.sleep("15m") is False
    with pytest.raises(ValueError):
        control_channel.sleep("soon")
    assert control_channel.main(["sleep", "soon"]) == 2


def _ctx() -> Context:
    return Context(data={"a": 1}, instance_id=7, flow="f", state="work", attempt=1)


def test_call_handler_sleep_requests() -> None:
    ctx = _ctx()
    when = datetime(2026, 12, 1, 9, tzinfo=UTC)
    result = _returned(ctx.sleep_until(when), ctx, "done")
    assert (result.outcome, result.sleep_until) == ("sleep", when.timestamp())
    assert result.error == "sleep until 2026-12-01T09:00:00Z"
    ctx = _ctx()
    ctx.sleep_until(AT)  # then returning None sleeps too
    assert _returned(None, ctx, "done").sleep_until == AT
    ctx = _ctx()
    ctx.sleep_until(AT)  # a returned state wins: the request is dropped
    assert _returned("done", ctx, "done").outcome == "moved"
    assert _returned(Sleep.at(datetime(2026, 12, 1, 9)), _ctx(), None).sleep_until == (
        when.timestamp()
    )
    with pytest.raises(TypeError):
        _ctx().sleep_until("tomorrow")


def test_a_real_async_handler_sleeps() -> None:
    from runner.handlers.attempt import Cancel
    from runner.handlers.call_handler import run_call

    async def handler(ctx):
        return ctx.sleep_until(AT)

    result = asyncio.run(_run(run_call, handler, Limits(timeout=None, keepalive=None), Cancel()))
    assert (result.outcome, result.sleep_until) == ("sleep", AT)


async def _run(run_call, handler, limits, cancel):
    return await run_call(
        handler, _ctx(), limits=limits, cancel=cancel, threads=None, next_state="done"
    )


def _claim(errors: list[float]) -> Claim:
    return Claim(
        id=1,
        flow="s",
        version="v",
        state="work",
        data={"a": 1},
        fence=3,
        attempt=2,
        errors=len(errors),
        restarts=1,
        state_errors=list(errors),
        state_restarts=1,
        event_id=None,
    )


def test_decide_sleeps_and_spends_nothing(tmp_path: Path) -> None:
    flow = load(write_flow(tmp_path, "s", FLOW))
    claim = _claim([AT - 10])
    result = slept(Sleep(AT + 3600), {"a": 2}, None)
    out = decide(flow, claim, result, {"a": 1}, AT)
    v = out.values
    assert (v["state"], v["status"], v["due_at"]) == ("work", "sleeping", AT + 3600)
    assert (v["errors"], v["restarts"], v["state_errors"], v["state_restarts"]) == (
        1,
        1,
        [AT - 10],
        1,
    )
    assert v["data"] == {"a": 2} and v["last_error"] is None
    assert out.attempt_values["outcome"] == "sleep"
    assert out.attempt_values["error"].startswith("sleep until ")
    past = decide(flow, claim, AttemptResult("sleep", {}, sleep_until=AT - 5), {}, AT)
    assert (past.values["status"], past.values["due_at"]) == ("runnable", AT)


def test_a_state_that_waits_for_an_event_cannot_sleep(tmp_path: Path) -> None:
    from runner.ops import commands
    from tests.support.fault import engine_at, new_instance, row

    flow = load(
        write_flow(
            tmp_path / "flows",
            "ext",
            "initial: gate\nstates:\n  gate: {external: true, on: {go: done}}\n"
            "  done: {terminal: true}\n",
        )
    )
    engine = engine_at(tmp_path)
    iid = new_instance(engine, flow)
    [res] = commands.submit(engine, [iid], "sleep", until=AT)
    assert not res.ok
    assert res.message == f"cannot sleep: instance {iid} is in 'gate', which waits for an event"
    assert row(engine, iid)["status"] == "runnable"
    with pytest.raises(Exception, match="sleep needs a wake time"):
        commands.submit(engine, [iid], "sleep")
