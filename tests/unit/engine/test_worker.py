"""The worker loop in-process on a real SQLite file: what it commits, and how chained moves
(an instance continuing in the same worker without a new claim) are recorded."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

from runner.engine.config import WorkerConfig
from runner.engine.cycle import MAX_CHAIN, CycleRequest
from runner.engine.worker import Worker
from runner.ops import detail
from runner.service.daemon import serve
from runner.service.startup import load_registry
from runner.store.create import create_instance
from runner.store.db import make_engine


def _setup(tmp_path: Path, states: str, tasks: str):
    mod = f"tasks_{uuid.uuid4().hex[:8]}"
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / f"{mod}.py").write_text(tasks)
    (flows / "w.yaml").write_text(f"flow: w\ninitial: a\nstates:\n{states.format(mod=mod)}")
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    return engine, load_registry(engine, flows)


def _drain(engine, registry, **kw) -> Worker:
    cfg = WorkerConfig(exit_when_idle=True, worker_id="w1", **kw)
    served = asyncio.run(serve(engine, registry, cfg, install_signals=False, sensors=False))
    return served.worker


def test_nested_changes_to_data_are_committed(tmp_path: Path) -> None:
    engine, reg = _setup(
        tmp_path,
        "  a: {{call: '{mod}:nest', next: done}}\n  done: {{terminal: true}}\n",
        "async def nest(ctx):\n"
        "    ctx.data['summary']['rows'] = 42\n"
        "    ctx.data['tags'].append('seen')\n"
        "    return True\n",
    )
    with engine.begin() as conn:
        iid = create_instance(conn, reg.get("w"), {"summary": {"rows": 0}, "tags": []})
    worker = _drain(engine, reg)
    assert worker.cycles.wal is not None, "on a SQLite file the worker runs a WAL checkpointer"
    assert not any(t.name == "flowrun-wal" for t in threading.enumerate()), "and stops it"
    item = detail.get_instance(engine, iid)
    assert item["status"] == "completed"
    assert item["data"] == {"summary": {"rows": 42}, "tags": ["seen"]}
    assert worker.stats.items() == [
        ("claimed", 1),
        ("chained", 0),
        ("committed", 1),
        ("cancelled", 0),
        ("lost_fence", 0),
        ("recovered", 0),
        ("handed", 0),
    ], "the counters of the daemon's exit line"


def test_chained_moves_are_separate_attempts(tmp_path: Path) -> None:
    """A loop a → b → a … runs in one worker; every move is its own attempt row, numbered
    in order, and the chain is bounded (the instance is released and claimed again)."""
    moves = MAX_CHAIN * 2 + 3
    engine, reg = _setup(
        tmp_path,
        "  a: {{call: '{mod}:step', to: [b, done]}}\n"
        "  b: {{call: '{mod}:step', to: [a, done]}}\n"
        "  done: {{terminal: true}}\n",
        "async def step(ctx):\n"
        f"    if ctx.attempt >= {moves}:\n"
        "        return 'done'\n"
        "    return 'b' if ctx.state == 'a' else 'a'\n",
    )
    with engine.begin() as conn:
        iid = create_instance(conn, reg.get("w"), {})
    _drain(engine, reg, concurrency=4)
    item = detail.get_instance(engine, iid)
    assert item["status"] == "completed" and item["attempts"] == moves
    history = item["history"]
    assert [h["attempt"] for h in history] == list(range(1, moves + 1))
    assert all(h["outcome"] == "moved" and h["finished_at"] for h in history)
    states = [h["state"] for h in history]
    assert states[:4] == ["a", "b", "a", "b"]
    assert all(h["to_state"] == nxt for h, nxt in zip(history, states[1:], strict=False))
    assert item["locked_by"] is None and item["running_attempt"] is None


def test_a_held_write_lock_sends_the_cycle_to_the_database_thread(tmp_path: Path) -> None:
    """On SQLite the worker runs its cycle on the loop only when the write lock is free
    at once; while another process holds it, the cycle goes to the database thread (which
    waits for the lock) and the loop never blocks. The work is done either way."""
    import sqlite3

    engine, reg = _setup(
        tmp_path,
        "  a: {{call: '{mod}:ok', next: done}}\n  done: {{terminal: true}}\n",
        "async def ok(ctx):\n    return True\n",
    )
    with engine.begin() as conn:
        iid = create_instance(conn, reg.get("w"), {})
    other = sqlite3.connect(tmp_path / "w.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock

    async def main() -> None:
        worker = Worker(engine, WorkerConfig(worker_id="w0", lease=0.2))
        busy = worker.cycles.submit(CycleRequest("w0", 0.2, free=8))
        await asyncio.sleep(0.2)
        assert not busy.done(), "busy: the cycle waits on the database thread, not the loop"
        other.execute("COMMIT")
        assert [c.id for c in (await busy).claims] == [iid]
        free = worker.cycles.submit(CycleRequest("w0", 0.2, free=8))
        assert free.done(), "the lock is free: the cycle ran right here on the loop"
        assert (await free).claims == []
        worker.cycles.close()
        worker._db.shutdown()

    asyncio.run(main())
    other.close()
    _drain(engine, reg)  # w0 "died" holding its claim: the lease (0.2 s) runs out first
    item = detail.get_instance(engine, iid)
    assert (item["status"], item["restarts"]) == ("completed", 1)


def test_exit_when_idle_does_not_spin_while_an_attempt_runs(tmp_path: Path) -> None:
    """The look for anything left is one of the loop's timers only while the worker is
    quiet: an attempt running 1 s turns the loop a few times (its fence polls), not in a
    busy loop."""
    engine, reg = _setup(
        tmp_path,
        "  a: {{call: '{mod}:nap', next: done}}\n  done: {{terminal: true}}\n",
        "import asyncio\nasync def nap(ctx):\n    await asyncio.sleep(1.0)\n    return True\n",
    )
    with engine.begin() as conn:
        create_instance(conn, reg.get("w"), {})
    turns = [0]
    worker = _drain(engine, reg, on_tick=lambda: turns.__setitem__(0, turns[0] + 1))
    assert worker.stats.committed == 1
    # ~4 fence polls a second and a few cycles; a spinning loop turns thousands of times
    assert turns[0] < 200, f"{turns[0]} loop turns for one 1 s attempt"
