"""Where a SQLite cycle runs while another connection holds the write lock
(``engine.cycle_runner``): tried again on the loop a millisecond apart, and only after
``INLINE_TRIES`` on the database thread, which waits in SQLite's busy handler. A real
SQLite file, its lock held by a second connection."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.engine import cycle
from runner.engine.cycle import CycleRequest, CycleResult
from runner.engine.cycle_runner import INLINE_AGAIN, INLINE_TRIES, CycleRunner
from runner.engine.db_thread import DatabaseThread
from runner.engine.running import RunningAttempts
from runner.store import heartbeat
from tests.support.fault import flow_world, new_instance, sql

FLOW = """\
initial: a
states:
  a: {exec: [/bin/true], next: done}
  done: {terminal: true}
"""


def _world(tmp_path: Path) -> tuple[Engine, int]:
    """A SQLite file with one runnable instance (its id) and worker ``w`` registered."""
    engine, flow = flow_world(tmp_path, "f", FLOW)
    iid = new_instance(engine, flow)
    heartbeat.register(engine, "w")
    return engine, iid


def _submit_while_locked(
    engine: Engine,
) -> tuple[DatabaseThread, CycleRunner, sqlite3.Connection, asyncio.Future[CycleResult]]:
    """On the running loop: a claiming cycle submitted while a second connection (returned,
    to ``COMMIT``) holds the write lock; its database thread, runner and future."""
    db = DatabaseThread()
    attempts = RunningAttempts(engine, "w", concurrency=4, kill_grace=1.0, in_db=db.call)
    runner = CycleRunner(engine, attempts, db)
    blocker = sqlite3.connect(engine.url.database or "", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    request = runner.request(CycleRequest("w", 30.0, free=4), stopping=False)
    return db, runner, blocker, runner.submit(request)


def _claim_while_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: float | None
) -> tuple[CycleResult, list[str], int]:
    """Submit a claiming cycle while another connection holds the write lock for ``held``
    seconds (``None``: until the loop's next turn, before the cycle's next try); its
    result, the threads ``run_cycle`` ran on, and the instance's id."""
    engine, iid = _world(tmp_path)
    ran_on: list[str] = []
    real = cycle.run_cycle

    def spied(*args):
        ran_on.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(cycle, "run_cycle", spied)

    async def scenario() -> CycleResult:
        db, runner, blocker, fut = _submit_while_locked(engine)
        if held is None:  # call_soon runs before the next try's timer
            asyncio.get_running_loop().call_soon(blocker.execute, "COMMIT")
        else:
            await asyncio.sleep(held)
            blocker.execute("COMMIT")
        try:
            return await asyncio.wait_for(fut, 30)
        finally:
            blocker.close()
            runner.close()
            db.shutdown()

    try:
        return asyncio.run(scenario()), ran_on, iid
    finally:
        engine.dispose()


def test_a_cycle_meeting_a_short_write_is_run_again_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, ran_on, iid = _claim_while_locked(tmp_path, monkeypatch, None)
    assert [c.id for c in result.claims] == [iid]
    loop_thread = threading.current_thread().name
    assert len(ran_on) == 2 and set(ran_on) == {loop_thread}, ran_on


def test_a_cycle_meeting_a_long_write_goes_to_the_database_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the lock held well past the tries on the loop: the thread waits for it
    result, ran_on, iid = _claim_while_locked(
        tmp_path, monkeypatch, INLINE_TRIES * INLINE_AGAIN + 0.3
    )
    assert [c.id for c in result.claims] == [iid]
    loop_thread = threading.current_thread().name
    assert ran_on[:INLINE_TRIES] == [loop_thread] * INLINE_TRIES, ran_on
    assert ran_on[-1] != loop_thread, ran_on


def test_a_cycle_waiting_for_its_next_try_is_cancelled_by_close(tmp_path: Path) -> None:
    engine, _ = _world(tmp_path)

    async def scenario() -> asyncio.Future[CycleResult]:
        db, runner, blocker, fut = _submit_while_locked(engine)
        try:
            runner.close()  # the worker ends before the next try
        finally:
            blocker.execute("COMMIT")
            blocker.close()
            db.shutdown()
        await asyncio.sleep(INLINE_AGAIN * (INLINE_TRIES + 2))
        return fut

    try:
        fut = asyncio.run(scenario())
        assert fut.cancelled()
        locked = sql(engine, "SELECT count(*) FROM instances WHERE locked_by IS NOT NULL")
        assert locked[0][0] == 0, "a cycle claimed after its worker closed"
    finally:
        engine.dispose()
