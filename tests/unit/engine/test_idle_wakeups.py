"""An idle daemon's parts do not poll for nothing: counted, not timed.

Over a window of idleness (nothing due, nothing committed by anyone), on a real SQLite
file: the worker sends no statement for its looks for due work nor, after a look that
found nothing locked, for lost attempts (its looks read SQLite's change counter instead,
``runner.store.data_version``) and its loop turns about
as often as its timers say, never in a busy loop; the rule engine does not look for
pending events; the WAL checkpointer checkpoints nothing; the reaper's thread does not
sweep while no attempt runs and no child is left. A commit by another connection still
ends the worker's wait at its next look (the latency of ``flowrun start`` on SQLite),
even one counted a moment after the bell it rang.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, event

from runner.engine.config import WorkerConfig
from runner.engine.idle_looks import BELL_FALLBACK, RECHECK_FIRST, RECHECK_LAST, IdleLooks
from runner.engine.worker import Worker
from runner.flowspec.compiler import load_flow
from runner.handlers import reaper
from runner.store.create import create_instances
from runner.store.db import make_engine
from runner.store.wal import WalCheckpointer
from tests.support.sensor_hub import registry, running_hub, wait_until, write_flow

WINDOW = 2.0  # seconds of idleness counted

WORK = """\
flow: later
initial: work
states:
  work: {exec: [sh, -c, "exit 0"], next: done}
  done: {terminal: true}
"""


class Statements:
    """Counts the statements every engine of this process sends while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list[str] = []
        event.listen(Engine, "before_cursor_execute", self._note)

    def _note(self, _conn, _cursor, statement, *_rest) -> None:
        if self.on:
            self.seen.append(" ".join(statement.split())[:400])

    def close(self) -> None:
        event.remove(Engine, "before_cursor_execute", self._note)


def _later_world(tmp_path: Path) -> tuple[str, Path, Engine]:
    """A SQLite file's URL, the ``later`` flow's file and an engine on the file."""
    url = f"sqlite:///{tmp_path / 'flowrun.db'}"
    flows = tmp_path / "flows"
    flows.mkdir()
    path = flows / "later.yaml"
    path.write_text(WORK)
    return url, path, make_engine(url)


def test_an_idle_worker_sends_no_statement_to_look_for_work(tmp_path: Path) -> None:
    url, path, engine = _later_world(tmp_path)
    turns = [0]
    # a long lease: no lease renewal or heartbeat in the window; the looks for lost
    # attempts come due every second (min(1, lease / 4)) and are skipped
    config = WorkerConfig(
        worker_id="idler", lease=600, on_tick=lambda: turns.__setitem__(0, turns[0] + 1)
    )
    worker = Worker(engine, config)
    counted = Statements()

    async def scenario() -> tuple[int, list[str], float]:
        task = asyncio.ensure_future(worker.run())
        await asyncio.sleep(1.0)  # started, first cycles done
        turns[0], counted.on = 0, True
        await asyncio.sleep(WINDOW)
        counted.on = False
        idle_turns = turns[0]
        # another process starts an instance: the worker claims it at its next look
        other = make_engine(url)
        with other.begin() as conn:
            create_instances(conn, load_flow(path), [{}])
        other.dispose()
        started = time.monotonic()
        await wait_until(lambda: worker.stats.claimed >= 1, timeout=10, every=0.005)
        latency = time.monotonic() - started
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        return idle_turns, list(counted.seen), latency

    try:
        idle_turns, seen, latency = asyncio.run(scenario())
    finally:
        counted.close()
        engine.dispose()
    looks = [s for s in seen if "due_at <=" in s]
    assert looks == [], f"{len(looks)} looks for due work in {WINDOW}s idle: {looks[:3]}"
    # nor for lost attempts: while nobody commits, the last look (nothing locked, held or
    # waiting: ``leases.may_recover``) holds; it would be one a second otherwise
    recover_looks = [s for s in seen if "EXISTS" in s.upper()]
    assert len(recover_looks) <= 1, f"{len(recover_looks)} looks for lost attempts: {seen}"
    assert len(seen) <= 4, seen
    # a 50 ms look and the 1 s chores: ~20 turns a second; a busy loop would be thousands
    assert idle_turns <= 40 * WINDOW, f"{idle_turns} loop turns in {WINDOW}s idle"
    assert latency < 0.5, f"the claim came {latency:.2f}s after the commit"


def test_a_commit_counted_after_its_ring_is_claimed_at_a_recheck(tmp_path: Path) -> None:
    """A commit rings the bell as it writes the ``-wal``, a moment before SQLite counts it;
    a committer descheduled in between (a busy machine) publishes it with no ring of
    its own. Here: a ring with nothing counted yet, then a commit whose own ring is not
    heard. The worker must claim it at a recheck, not at its next look (2 s here)."""
    url, path, engine = _later_world(tmp_path)
    # looks between rings every 2 s (0.05 by default): a missed commit waits for it
    worker = Worker(engine, WorkerConfig(worker_id="idler", lease=600, poll=2.0))

    async def scenario() -> float:
        task = asyncio.ensure_future(worker.run())
        await wait_until(lambda: worker._looks.listening, timeout=10, every=0.01)
        looks = worker._looks
        assert looks.bell is not None
        loop = asyncio.get_running_loop()
        other, flow = make_engine(url), load_flow(path)
        with other.connect() as conn:  # connected before the ring: the commit is quick
            conn.exec_driver_sql("SELECT 1")
        looks.ring(worker._rung)  # the -wal written, the commit not counted yet
        await asyncio.sleep(0.02)  # the look at the ring found the counter unmoved
        loop.remove_reader(looks.bell.fd)  # the commit's own ring is not heard
        with other.begin() as conn:
            create_instances(conn, flow, [{}])
        other.dispose()
        looks.bell.drain()
        loop.add_reader(looks.bell.fd, looks.ring, worker._rung)
        started = time.monotonic()
        await wait_until(lambda: worker.stats.claimed >= 1, timeout=10, every=0.005)
        latency = time.monotonic() - started
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        return latency

    try:
        latency = asyncio.run(scenario())
    finally:
        engine.dispose()
    assert latency < 0.5, f"claimed {latency:.2f}s after the commit"


def test_rechecks_after_a_ring_double_then_give_way_to_the_fallback() -> None:
    looks = IdleLooks(listening=True)
    assert looks.next_look(0.05) == BELL_FALLBACK  # no ring: the fallback
    looks.ring(lambda: None)
    waits = []
    while (wait := looks.next_look(0.05)) != BELL_FALLBACK:
        waits.append(wait)
    assert waits[0] == RECHECK_FIRST and waits[-1] == RECHECK_LAST
    assert all(b == 2 * a for a, b in zip(waits, waits[1:], strict=False))
    looks.ring(lambda: None)  # a new ring starts them again
    assert looks.next_look(0.05) == RECHECK_FIRST


def test_an_idle_rule_engine_does_not_look_for_events(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "idle", "")
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    looks = [0]

    async def scenario() -> None:
        async with running_hub(engine, flows, poll=0.05) as hub:
            real = hub.rules.handle_pending

            def counting():
                looks[0] += 1
                return real()

            hub.rules.handle_pending = counting
            await asyncio.sleep(0.5)
            looks[0] = 0
            await asyncio.sleep(WINDOW)
            idle = looks[0]
            assert idle <= 1, f"{idle} looks for pending events in {WINDOW}s idle (poll 0.05s)"
            # an event stored by another daemon (a commit): looked at by the next poll
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "INSERT INTO events (sensor, key, payload, created_at) "
                    "VALUES ('idle.x', 'k', '{}', 0)"
                )
            await wait_until(lambda: looks[0] > idle, timeout=5, every=0.01)

    try:
        asyncio.run(scenario())
    finally:
        engine.dispose()
    assert registry(flows).flows  # the flow loaded: the hub ran for real


def test_an_idle_wal_checkpointer_checkpoints_nothing(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (v)")
    ckpt = WalCheckpointer(str(path), every=0.01).start()
    try:
        time.sleep(0.3)
        before = ckpt.checkpoints
        time.sleep(WINDOW)
        assert ckpt.checkpoints == before, "checkpoints of an unchanged database"
        assert ckpt.looks - before < 20, f"{ckpt.looks} looks (every 0.01s: 200)"
        conn.execute("INSERT INTO t VALUES (1)")
        deadline = time.monotonic() + 10
        while ckpt.checkpoints == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ckpt.checkpoints > before, "a commit was never checkpointed"
    finally:
        ckpt.stop()
        conn.close()


def test_the_reaper_sleeps_while_no_attempt_runs(monkeypatch) -> None:
    sweeps = [0]
    real = reaper.sweep

    def counting() -> bool:
        sweeps[0] += 1
        return real()

    monkeypatch.setattr(reaper, "sweep", counting)
    # attempts earlier tests in this process left marked running are not this test's
    monkeypatch.setattr(reaper, "_running", set())
    monkeypatch.setattr(reaper, "_signalled", {})
    reaper.start()
    try:
        # nothing left from earlier tests in this process (a child still exiting under
        # load keeps the reaper looking, rightly): wait for that, then count
        deadline = time.monotonic() + 30
        while real() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not real(), "children of earlier tests never went away"
        time.sleep(0.3)  # the watch thread's current look ends
        sweeps[0] = 0
        time.sleep(WINDOW)
        assert sweeps[0] <= 1, f"{sweeps[0]} sweeps in {WINDOW}s with nothing to do"
        token = reaper.new_token()  # an attempt starts: the reaper watches again
        deadline = time.monotonic() + 5
        while sweeps[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sweeps[0] >= 3, "the reaper did not wake for a running attempt"
        reaper.ended(token)
    finally:
        reaper.stop()
