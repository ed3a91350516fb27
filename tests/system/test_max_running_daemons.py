"""Flow limits with real daemons (issue 28, item 2): ``max_running: 1`` with a clock sensor
ticking every second and a 3 s handler. ``on_limit: skip`` makes no overlapping instance
and records the skips on the events; ``queue`` makes them all and runs them one at a time;
a keyed limit lets different keys run together. SQLite (one daemon) and the real
PostgreSQL server (two daemons).

Each handler appends a start and an end line to one ``O_APPEND`` file (one ``write`` per
line: the kernel orders them across processes), so the overlap is counted from the
file's order, never from clocks.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from runner.store.db import make_engine
from tests.support.fault import Flowrun, daemon_running, poll, sql, unique, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FLOW = """\
initial: run
max_running: MAXRUN
on_limit: BEHAVIOUR
sensors:
  tick: {every: 1s}
rules:
  - when: tick
    start: nightly
    data: {log: "LOG", hold: "3"}
states:
  run: {call: "MODULE:run", next: done}
  done: {terminal: true}
"""

KEYED = """\
initial: run
max_running: {limit: 1, key: "{data.customer}"}
states:
  run: {call: "MODULE:run", next: done}
  done: {terminal: true}
"""

TASKS = """\
import asyncio

def _append(path, kind, ctx, key):  # mode "a": O_APPEND, one write per line
    with open(path, "a", buffering=1) as out:
        out.write(f"{kind} {ctx.instance_id} {key}\\n")

async def run(ctx):
    key = ctx.data.get("customer", "-")
    _append(ctx.data["log"], "S", ctx, key)
    await asyncio.sleep(float(ctx.data["hold"]))
    _append(ctx.data["log"], "E", ctx, key)
    return True
"""


def most_at_once(log: Path, key: str | None = None) -> int:
    """The most attempts running at once (of ``key`` only, when given), in file order."""
    running, most = 0, 0
    for line in log.read_text().splitlines():
        kind, _iid, k = line.split()
        if key is not None and k != key:
            continue
        running += 1 if kind == "S" else -1
        most = max(most, running)
    return most


def _world(tmp: Path, body: str, db: str | None) -> tuple[Flowrun, Path]:
    fr = Flowrun(tmp)
    if db is not None:
        fr.db = db
    module = unique("limit_tasks")
    log = tmp / "runs.log"
    text = body.replace("MODULE", module).replace("LOG", str(log))
    write_flow(fr.flows, "nightly", text, {module: TASKS})
    return fr, log


def _count(fr: Flowrun, statement: str) -> int:
    engine = make_engine(fr.db)
    try:
        return int(sql(engine, statement)[0][0])
    finally:
        engine.dispose()


def _daemons(fr: Flowrun, n: int) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for k in range(n):
        stack.enter_context(daemon_running(fr, f"d{k}", "--idle-poll", "0.1"))
    return stack


def _dbs():
    return ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("db", _dbs())
def test_skip_makes_no_overlapping_instance_and_records_the_skips(tmp_path, db, request):
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    body = FLOW.replace("MAXRUN", "1").replace("BEHAVIOUR", "skip")
    fr, log = _world(tmp_path, body, url)
    skipped = "SELECT count(*) FROM events WHERE action LIKE 'skipped start of nightly%'"
    with _daemons(fr, 2 if db == "postgres" else 1):
        poll(
            lambda: (
                _count(fr, "SELECT count(*) FROM instances WHERE status = 'completed'") >= 2
                and _count(fr, skipped) >= 3
            ),
            120,
            0.2,
            "two instances completed and three ticks skipped",
        )
    assert most_at_once(log) == 1
    engine = make_engine(fr.db)
    try:
        rows = sql(engine, "SELECT id, created_at, updated_at, status FROM instances ORDER BY id")
        actions = [r[0] for r in sql(engine, "SELECT action FROM events WHERE action IS NOT NULL")]
    finally:
        engine.dispose()
    # no instance was made while another was live: each was made after the last one ended
    done = [r for r in rows if r[3] == "completed"]
    for before, after in zip(rows, rows[1:], strict=False):
        assert before[3] == "completed" and after[1] >= before[2], rows
    assert len(done) >= 2
    why = [a for a in actions if a.startswith("skipped")]
    assert why and all(": max_running of flow nightly: 1/1 live: " in a for a in why), why
    started = [a for a in actions if a.startswith("started nightly instance")]
    assert len(started) == len(rows)  # every other tick was skipped, with its reason


def test_queue_makes_them_all_and_runs_one_at_a_time(tmp_path):
    body = FLOW.replace("MAXRUN", "1").replace("BEHAVIOUR", "queue")
    fr, log = _world(tmp_path, body, None)
    waiting = "SELECT count(*) FROM instances WHERE waiting_for = 'flow:nightly' AND due_at IS NULL"
    with _daemons(fr, 1):
        poll(lambda: _count(fr, waiting) >= 2, 60, 0.1, "two instances waiting for the limit")
        poll(lambda: _explains_a_wait(fr, waiting), 60, 0.2, "explain naming the limit")
        poll(
            lambda: _count(fr, "SELECT count(*) FROM instances WHERE status = 'completed'") >= 3,
            120,
            0.2,
            "three instances completed",
        )
    assert most_at_once(log) == 1
    assert log.read_text().count("S ") >= 3
    # none was skipped: the ticks made more instances than ran
    assert _count(fr, "SELECT count(*) FROM instances") > 3


def _explains_a_wait(fr: Flowrun, waiting: str) -> bool:
    """``flowrun explain`` of the oldest waiter says what it waits for (retried: the
    waiter may be woken between the read and the explain)."""
    waiter = _count(fr, waiting.replace("count(*)", "coalesce(min(id), 0)"))
    res = fr("explain", str(waiter))
    return "waiting for max_running of flow nightly: 1/1 running: " in res.stdout


def test_a_keyed_limit_lets_different_keys_run_together(tmp_path):
    fr, log = _world(tmp_path, KEYED, None)
    for customer in ("acme", "acme", "bolt", "bolt"):
        data = json.dumps({"customer": customer, "hold": 1.5, "log": str(log)})
        res = fr("start", "nightly", "--data", data)
        assert res.returncode == 0, res.stderr
    with _daemons(fr, 1):
        poll(
            lambda: _count(fr, "SELECT count(*) FROM instances WHERE status = 'completed'") == 4,
            120,
            0.2,
            "every instance completed",
        )
    assert most_at_once(log, "acme") == 1 and most_at_once(log, "bolt") == 1
    assert most_at_once(log) == 2
