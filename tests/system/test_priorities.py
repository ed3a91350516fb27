"""Priorities with a real daemon, on a SQLite file and on the real PostgreSQL server
(issue 28, item 4): of instances due at once, the 9s run before the 1s, even when the 1s
were due first; a pool's free slot goes to its waiter of the higher priority, even when
the lower one waited longer.

Each handler appends a line to one ``O_APPEND`` file (one ``write`` per line), so the
file's order is the true order of starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.flowspec.compiler import load_flow
from runner.store.create import create_instances
from runner.store.db import make_engine
from tests.support.fault import Flowrun, daemon_running, poll, sql, unique, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FLOW = """\
initial: run
pools: {one: 1}
states:
  run: {call: "MODULE:run", POOLnext: done}
  done: {terminal: true}
"""

TASKS = """\
import asyncio, os

async def run(ctx):
    fd = os.open(ctx.data["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.data['tag']} {ctx.instance_id}\\n".encode())
    finally:
        os.close(fd)
    go = ctx.data.get("go")
    while go and not os.path.exists(go):  # held until the test lets it end
        await asyncio.sleep(0.02)
    return True
"""

DBS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _world(tmp: Path, db: str, request, pooled: bool = False):
    fr = Flowrun(tmp)
    if db == "postgres":
        fr.db = request.getfixturevalue("pg_url")
    module = unique("prio_tasks")
    body = FLOW.replace("MODULE", module).replace("POOL", "pool: one, " if pooled else "")
    path = write_flow(fr.flows, "pr", body, {module: TASKS})
    return fr, load_flow(path)


def _create(fr: Flowrun, flow, datas: list[dict], priority: int | None) -> None:
    engine = make_engine(fr.db)
    try:
        with engine.begin() as conn:
            create_instances(conn, flow, datas, priority=priority)
    finally:
        engine.dispose()


def _count(fr: Flowrun, where: str) -> int:
    engine = make_engine(fr.db)
    try:
        return sql(engine, f"SELECT count(*) FROM instances WHERE {where}")[0][0]
    finally:
        engine.dispose()


def _tags(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("db", DBS)
def test_nines_run_before_ones_when_both_are_due(tmp_path: Path, db: str, request) -> None:
    fr, flow = _world(tmp_path, db, request)
    log = tmp_path / "runs.log"
    # the 1s are created (due) first, the 9s after: due order alone would run the 1s first
    _create(fr, flow, [{"log": str(log), "tag": "p1"}] * 20, 1)
    _create(fr, flow, [{"log": str(log), "tag": "p9"}] * 19, 9)
    res = fr("start", "pr", "--priority", "9", f"log={log}", "tag=p9")
    assert res.returncode == 0, res.stderr
    shown = fr("ls", "--json")
    assert shown.stdout.count('"priority": 9') == 20 and shown.stdout.count('"priority": 1') == 20
    with daemon_running(fr, "prio", "--concurrency", "1"):
        poll(lambda: len(_tags(log)) >= 40, 120, 0.1, "every instance ran")
    assert _tags(log) == ["p9"] * 20 + ["p1"] * 20
    assert _count(fr, "status = 'completed'") == 40


@pytest.mark.parametrize("db", DBS)
def test_a_pools_free_slot_goes_to_the_higher_priority(tmp_path: Path, db: str, request) -> None:
    fr, flow = _world(tmp_path, db, request, pooled=True)
    log, go = tmp_path / "runs.log", tmp_path / "go"
    with daemon_running(fr, "pool", "--concurrency", "4"):
        _create(fr, flow, [{"log": str(log), "tag": "holder", "go": str(go)}], None)
        poll(lambda: _tags(log) == ["holder"], 60, 0.05, "the holder running")
        _create(fr, flow, [{"log": str(log), "tag": "low"}], 1)  # waits longer
        _create(fr, flow, [{"log": str(log), "tag": "high"}], 9)
        poll(lambda: _count(fr, "waiting_for = 'one'") == 2, 60, 0.05, "both waiting")
        go.write_text("")
        poll(lambda: len(_tags(log)) >= 3, 60, 0.05, "both waiters ran")
    assert _tags(log) == ["holder", "high", "low"]
