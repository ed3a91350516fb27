"""The pieces of "safe when the network and the clock misbehave", each on its own: the
self-fencing deadlines (``engine.fence``), the database clock's readings
(``store.clock``) and the daemon threads a stuck call cannot keep alive
(``engine.db_thread``). The whole, against a frozen network and a skewed host, is in
``tests/system/test_postgres_fence.py`` and ``test_postgres_clock_skew.py``."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from runner.engine.fence import SelfFence
from runner.store.clock import LOCAL, SKEW_WARN, DbClock, clock_of, db_now
from runner.store.db import make_engine


@dataclass
class _Run:
    name: str
    until: float = 0.0


def _fence(lease: float, held: list[_Run], lapsed: list[tuple[str, float]]) -> SelfFence:
    return SelfFence(
        lease,
        5.0,
        held=lambda: list(held),
        lapse=lambda run: lapsed.append((run.name, time.monotonic())),
    )


def test_margin_keeps_kill_grace_and_slack_inside_the_lease() -> None:
    long, short = _fence(60.0, [], []), _fence(3.0, [], [])
    assert (long.grace, long.slack, long.margin) == (5.0, 1.0, 6.0)
    assert short.grace == pytest.approx(0.5) and short.slack == pytest.approx(0.3)
    # renewed every third of the lease, a healthy worker never reaches its deadline
    assert short.deadline(0.0) > 3.0 / 3


def test_an_attempt_is_ended_at_its_deadline_unless_renewed() -> None:
    async def scenario() -> tuple[list, float, float]:
        kept, dropped = _Run("kept"), _Run("dropped")
        held, lapsed = [kept, dropped], []
        fence = _fence(1.2, held, lapsed)  # margin 0.2 + 0.12: deadline 0.88 s after
        t0 = time.monotonic()
        fence.set(held, t0)
        for _ in range(6):  # renew "kept" every 0.3 s; "dropped" is not renewed
            await asyncio.sleep(0.3)
            fence.set([kept], time.monotonic())
        fence.close()
        return lapsed, t0, fence.deadline(t0)

    lapsed, t0, deadline = asyncio.run(scenario())
    assert [name for name, _ in lapsed] == ["dropped"]
    at = lapsed[0][1]
    assert deadline <= at < deadline + 0.25, (at - t0, deadline - t0)


def test_a_deadline_never_moves_back() -> None:
    async def scenario() -> float:
        run = _Run("r")
        fence = _fence(60.0, [run], [])
        fence.set([run], 100.0)
        fence.set([run], 50.0)  # an older renewal's answer arriving late
        fence.close()
        return run.until

    assert asyncio.run(scenario()) == 100.0 + 60.0 - 6.0


def test_clock_offset_from_a_bracketed_reading(caplog: pytest.LogCaptureFixture) -> None:
    clock = DbClock("test db")
    caplog.set_level(logging.WARNING, "flowrun.clock")
    clock.observe(1000.0 + 90.0, 999.9, 1000.1)  # the server read its clock at ~1000
    assert clock.offset == pytest.approx(90.0) and clock.error == pytest.approx(0.1)
    clock.observe(1000.0 + 95.0, 990.0, 1010.0)  # a slow reading: ignored
    assert clock.offset == pytest.approx(90.0)
    clock.observe(2000.0 + 89.5, 1999.99, 2000.01)  # a tighter one replaces it
    assert clock.offset == pytest.approx(89.5) and clock.error == pytest.approx(0.01)
    clock.observe(3000.0 + 91.0, 2999.99, 3000.01)
    warned = [r for r in caplog.records if "clock is" in r.getMessage()]
    assert len(warned) == 1 and "-90.0 s off the clock of test db" in warned[0].getMessage()
    assert abs(clock.now() - time.time() - 91.0) < 0.01


def test_a_small_offset_is_not_worth_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = DbClock()
    caplog.set_level(logging.WARNING, "flowrun.clock")
    clock.observe(1000.0 + SKEW_WARN / 2, 999.999, 1000.001)
    assert not caplog.records


def test_sqlite_keeps_the_local_clock(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite is one host's file: its leases and due times are this host's clock, read
    nowhere else and never corrected (PostgreSQL engines get a clock of their own)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    try:
        monkeypatch.setattr(time, "time", lambda: 1_000_000.0)
        assert clock_of(engine) is LOCAL and LOCAL.offset == 0.0
        assert db_now(engine) == 1_000_000.0
    finally:
        engine.dispose()


def test_a_call_stuck_on_a_daemon_thread_does_not_hold_the_exit() -> None:
    code = (
        "import time\n"
        "from runner.engine.db_thread import DaemonThreads\n"
        "pool = DaemonThreads('stuck', 2)\n"
        "stuck = [pool.submit(time.sleep, 60) for _ in range(2)]\n"
    )
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert time.monotonic() - t0 < 10
