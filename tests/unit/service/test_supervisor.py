"""The daemon's supervisor: expected faults retried until the part resumes, bugs restarted
a few times then given up (exit 70), parts that cannot restart given up at once."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from runner.engine.config import WorkerConfig
from runner.flowspec.registry import FlowRegistry
from runner.sensors import hub as hub_module
from runner.sensors.clock import ClockSensor
from runner.service.daemon import serve
from runner.service.stopping import EXIT_FATAL
from runner.service.supervisor import Supervisor
from runner.store.db import make_engine


def _outage() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("connection refused"))


async def test_expected_fault_is_retried_until_the_part_resumes(caplog) -> None:
    sup = Supervisor(base=0.01, cap=0.02)
    calls = []

    async def part() -> None:
        calls.append(1)
        if len(calls) < 20:
            raise _outage()

    with caplog.at_level(logging.WARNING, "flowrun.supervisor"):
        await sup.keep("db part", part)
    assert len(calls) == 20 and sup.fatal is None
    assert sup.parts["db part"].state == "done" and sup.parts["db part"].restarts == 19
    assert all(r.exc_info is None for r in caplog.records)  # no traceback for an outage
    # the first failure is logged; repeats within the quiet period are not
    assert sum("db part" in r.getMessage() for r in caplog.records) == 1


async def test_a_part_failing_after_a_while_is_one_outage_not_one_line_a_restart(
    caplog,
) -> None:
    """A part that runs a while before each failure (the pruner waits before its first
    round) is not said to be running again at each restart, so its outage stays one
    line (repeats folded, at most every ``quiet_for``) and "running again" comes once,
    when it has really recovered."""
    sup = Supervisor(base=0.01, cap=0.01, back_after=1.0)
    runs = 0
    recovered = asyncio.Event()

    async def part() -> None:
        nonlocal runs
        runs += 1
        if runs <= 4:  # each run outlives back_after, then fails
            await asyncio.sleep(2.0)
            raise _outage()
        await recovered.wait()  # the database is back: it keeps running

    with caplog.at_level(logging.WARNING, "flowrun.supervisor"):
        task = asyncio.ensure_future(sup.keep("pruner", part))
        async with asyncio.timeout(120):
            while not any("running again" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.1)
        recovered.set()
        await task
    lines = [r.getMessage() for r in caplog.records]
    assert runs == 5
    assert [m.split(":")[0] for m in lines] == ["pruner", "pruner"], lines
    assert "connection refused; restarting in" in lines[0]
    assert lines[1] == "pruner: running again"


async def test_a_recurring_bug_gives_up_with_a_traceback(caplog) -> None:
    fatal = []
    sup = Supervisor(fatal.append, base=0.01, cap=0.01, bug_restarts=3)
    calls = []

    async def part() -> None:
        calls.append(1)
        raise ZeroDivisionError("bug")

    with caplog.at_level(logging.ERROR, "flowrun.supervisor"):
        await sup.keep("buggy", part)
    assert len(calls) == 4 and fatal == ["buggy"] and sup.fatal == "buggy"
    assert sup.parts["buggy"].state == "failed" and not sup.healthy()
    assert caplog.records[0].exc_info is not None


async def test_a_part_that_cannot_restart_gives_up_at_once() -> None:
    fatal = []
    sup = Supervisor(fatal.append)

    async def part() -> None:
        raise _outage()

    await sup.keep("worker", part, restart=False)
    assert fatal == ["worker"]


async def test_stop_ends_the_retries() -> None:
    sup = Supervisor(base=10, cap=10)
    stop = asyncio.Event()

    async def part() -> None:
        raise _outage()

    task = asyncio.ensure_future(sup.keep("p", part, stop))
    await asyncio.sleep(0.05)
    assert sup.parts["p"].state == "retrying"
    stop.set()
    await asyncio.wait_for(task, 5)
    assert sup.parts["p"].state == "done" and sup.fatal is None


class _BuggyClock(ClockSensor):
    """A sensor with a bug (the one way to reach a failing part in a real daemon)."""

    async def run(self, stop: asyncio.Event) -> None:
        raise RuntimeError("a bug in a sensor")


async def test_daemon_with_a_part_that_cannot_be_kept_alive_exits_70(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "t.yaml").write_text(
        "flow: t\ninitial: a\nstates:\n  a: {terminal: true}\nsensors:\n  tick: {every: 1h}\n"
    )
    monkeypatch.setitem(hub_module.SENSOR_TYPES, "every", _BuggyClock)
    registry = FlowRegistry(flows)
    assert not registry.load_all()
    engine = make_engine(f"sqlite:///{tmp_path / 'f.db'}")
    served = await asyncio.wait_for(
        serve(engine, registry, WorkerConfig(worker_id="w", lease=5), install_signals=False), 120
    )
    assert served.code == EXIT_FATAL
    assert served.supervisor.fatal == "sensor t.tick"
