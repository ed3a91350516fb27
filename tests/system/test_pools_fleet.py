"""Pools across a fleet of real daemons: a pool of 2 is never exceeded and is reached, a
``flowrun pool set`` mid-run is obeyed, and a SIGKILLed holder's slot comes back after
its lease (issue 28). Four daemons on the real PostgreSQL server, two on one SQLite file.

Each handler appends a start and an end line to one ``O_APPEND`` file (one ``write`` per
line: the kernel orders them), so the file's order is the true order of starts and ends
across every process; the overlap is counted from it, never from clocks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from runner.flowspec.compiler import load_flow
from runner.store.create import create_instances
from runner.store.db import make_engine
from tests.support.fault import Flowrun, daemon_running, poll, sql, unique, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

FLOW = """\
initial: load
pools: {warehouse: 2}
states:
  load: {call: "MODULE:run", pool: warehouse, next: done}
  done: {terminal: true}
"""

TASKS = """\
import asyncio, os, time

def _line(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

async def run(ctx):
    path = ctx.data["log"]
    _line(path, f"S {ctx.instance_id} {time.time():.6f}\\n")
    await asyncio.sleep(float(ctx.data.get("hold", 0.05)))
    _line(path, f"E {ctx.instance_id} {time.time():.6f}\\n")
    return True
"""


def overlaps(log: Path) -> list[tuple[float, int]]:
    """``(time, running)`` after each start line, in file order."""
    running, out = 0, []
    for line in log.read_text().splitlines():
        kind, _iid, at = line.split()
        running += 1 if kind == "S" else -1
        if kind == "S":
            out.append((float(at), running))
    return out


def _world(tmp: Path, db: str | None) -> tuple[Flowrun, Path, object]:
    fr = Flowrun(tmp)
    module = unique("pool_tasks")
    path = write_flow(fr.flows, "wh", FLOW.replace("MODULE", module), {module: TASKS})
    if db is not None:
        fr.db = db
    return fr, path, load_flow(path)


def _start(fr: Flowrun, flow, n: int, log: Path, hold: float) -> None:
    engine = make_engine(fr.db)
    try:
        with engine.begin() as conn:
            create_instances(conn, flow, [{"log": str(log), "hold": hold}] * n)
    finally:
        engine.dispose()


def _completed(fr: Flowrun) -> int:
    engine = make_engine(fr.db)
    try:
        return sql(engine, "SELECT count(*) FROM instances WHERE status = 'completed'")[0][0]
    finally:
        engine.dispose()


def _pool_limit_run(fr: Flowrun, flow, daemons: int, n: int, log: Path) -> None:
    """``n`` instances over ``daemons`` daemons: at most 2 at once, then 4 after a
    ``pool set`` at the half; every instance completes."""
    _start(fr, flow, n, log, 0.2)
    names = [f"d{k}" for k in range(daemons)]
    with contextlib_all(fr, names) as ds:
        poll(lambda: _completed(fr) >= n // 2, 300, 0.1, "half the instances completed")
        asked_at = time.time()
        res = fr("pool", "set", "warehouse", "4")
        assert res.returncode == 0, res.stderr
        set_at = time.time()
        poll(lambda: _completed(fr) >= n, 300, 0.1, "every instance completed")
    handed = sum(_handed(d.log()) for d in ds)
    print(f"pool seats handed on to standbys: {handed}")
    if fr.db.startswith("postgresql"):  # claims ahead there: standbys ran in handed seats
        assert handed > 0, "no seat was handed on: the limit was not tested with standbys"
    seen = overlaps(log)
    before = [k for t, k in seen if t < asked_at]
    after = [(t, k) for t, k in seen if t >= asked_at]
    assert max(before) == 2, f"the pool of 2 ran {max(before)} at once before the set"
    assert max(k for _, k in after) <= 4
    wider = [t for t, k in after if k > 2]
    assert wider, "pool set 4 was never obeyed"
    print(f"pool set obeyed {wider[0] - set_at:.3f} s after the command returned")
    assert wider[0] - set_at <= 1.0, "pool set not obeyed within a second"
    listed = json.loads(fr("pool", "ls", "--json").stdout)
    assert [(p["name"], p["slots"], p["declared"], p["in_use"]) for p in listed] == [
        ("warehouse", 4, 2, 0)
    ]


def _handed(log: str) -> int:
    """The pool seats a daemon handed on to standbys, from its closing line."""
    found = re.search(r"(\d+) pool seats? handed from an ended attempt", log)
    return int(found.group(1)) if found else 0


class contextlib_all:
    """Every daemon of ``names`` running (``daemon_running``), stopped together after."""

    def __init__(self, fr: Flowrun, names: list[str], *args: str, **kw) -> None:
        self.cms = [daemon_running(fr, name, *args, **kw) for name in names]

    def __enter__(self):
        return [cm.__enter__() for cm in self.cms]

    def __exit__(self, *exc) -> None:
        for cm in reversed(self.cms):
            cm.__exit__(*exc)


@pytest.mark.postgres
def test_four_daemons_on_postgresql_keep_a_pool_of_2(tmp_path: Path, pg_url: str) -> None:
    fr, _path, flow = _world(tmp_path, pg_url)
    _pool_limit_run(fr, flow, 4, 120, tmp_path / "runs.log")


def test_two_daemons_on_sqlite_keep_a_pool_of_2(tmp_path: Path) -> None:
    fr, _path, flow = _world(tmp_path, None)
    _pool_limit_run(fr, flow, 2, 80, tmp_path / "runs.log")


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_sigkilled_holders_slot_returns_after_its_lease(tmp_path: Path, db: str, request):
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    fr, _path, flow = _world(tmp_path, url)
    log = tmp_path / "runs.log"
    engine = make_engine(fr.db)
    try:
        _start(fr, flow, 2, log, 600)  # two long attempts, a pool set to 1 slot
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE pools SET slots = 1 WHERE name = 'warehouse'")
        with daemon_running(fr, "a", lease=4.0), daemon_running(fr, "b", lease=4.0):
            poll(lambda: log.exists() and log.read_text(), 60, 0.05, "the first start")
            poll(
                lambda: sql(engine, "SELECT id FROM instances WHERE waiting_for IS NOT NULL"),
                60,
                0.05,
                "the second instance waiting",
            )
            holder = sql(
                engine,
                "SELECT w.pid FROM instances i JOIN workers w ON w.id = i.locked_by"
                " WHERE i.running_attempt IS NOT NULL",
            )
            assert len(holder) == 1 and log.read_text().count("S ") == 1
            _visible(fr, engine)
            os.kill(holder[0][0], signal.SIGKILL)
            killed_at = time.time()
            poll(lambda: log.read_text().count("S ") >= 2, 60, 0.05, "the waiter's start")
            started = float(log.read_text().splitlines()[1].split()[2])
            assert started >= killed_at - 0.05, "the waiter started while the slot was held"
            print(f"slot back {started - killed_at:.2f} s after the SIGKILL (lease 4 s)")
    finally:
        engine.dispose()


def _visible(fr: Flowrun, engine) -> None:
    """explain, ls and pool ls say who waits for what, and who holds the slot."""
    (waiter,), (held,) = (
        sql(engine, "SELECT id FROM instances WHERE waiting_for IS NOT NULL")[0],
        sql(engine, "SELECT id FROM instances WHERE running_attempt IS NOT NULL")[0],
    )
    res = fr("explain", str(waiter))
    assert res.returncode == 0, res.stderr
    assert f"waiting for pool warehouse: 1/1 in use by {held}" in res.stdout
    ls = fr("ls")
    assert "pool warehouse" in ls.stdout
    listed = json.loads(fr("pool", "ls", "--json").stdout)
    assert [(p["slots"], p["in_use"], p["holders"], p["waiting"]) for p in listed] == [
        (1, 1, [held], 1)
    ]
    text = fr("pool", "ls").stdout
    assert "warehouse" in text and "1*" in text


RATED = """\
initial: call
states:
  call: {call: "MODULE:run", rate: 5/2s, next: done}
  done: {terminal: true}
"""


class StartsWatcher(threading.Thread):
    """Collects, until stopped, every claim time a rate records (``pools.starts`` of row
    ``key`` keeps the latest 5; at most 5 come per 2 s, so a look every 20 ms sees each)."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.seen: dict[float, int] = {}  # claim time: starts at it (one claim, many)
        self.done = threading.Event()

    def run(self) -> None:
        engine = make_engine(self.url)
        try:
            while not self.done.is_set():
                rows = sql(engine, "SELECT starts FROM pools WHERE name = :k", k=self.key)
                for (starts,) in rows:
                    value = json.loads(starts) if isinstance(starts, str) else starts
                    for at in set(value or []):
                        self.seen[at] = max(self.seen.get(at, 0), value.count(at))
                self.done.wait(0.02)
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    ("db", "daemons"), [("sqlite", 2), pytest.param("postgres", 4, marks=pytest.mark.postgres)]
)
def test_a_rate_is_never_exceeded_across_daemons(tmp_path: Path, db: str, daemons: int, request):
    fr = Flowrun(tmp_path)
    if db == "postgres":
        fr.db = request.getfixturevalue("pg_url")
    module = unique("rate_tasks")
    path = write_flow(fr.flows, "rated", RATED.replace("MODULE", module), {module: TASKS})
    _start(fr, load_flow(path), 30, tmp_path / "runs.log", 0.01)
    watcher = StartsWatcher(fr.db, "rated.call")
    watcher.start()
    try:
        with contextlib_all(fr, [f"r{k}" for k in range(daemons)]):
            poll(lambda: _completed(fr) >= 30, 120, 0.2, "every instance completed")
    finally:
        watcher.done.set()
        watcher.join(30)
    # the claims' own times (the database's clock) are what the rate counts; the
    # handlers start a little after their claim
    starts = sorted(at for at, n in watcher.seen.items() for _ in range(n))
    assert len(starts) == 30, "a claim time was missed (or a start made twice)"
    gaps = [starts[k + 5] - starts[k] for k in range(len(starts) - 5)]
    assert min(gaps) >= 2.0, f"6 starts within {min(gaps):.3f} s"
    assert min(starts[k + 4] - starts[k] for k in range(len(starts) - 4)) < 2.0


@pytest.mark.postgres
def test_a_daemon_sigkilled_while_holding_standbys_leaves_the_pool_exact(
    tmp_path: Path, pg_url: str
) -> None:
    """Three daemons share a pool of 2 with short attempts, so each holds standbys
    (claims ahead with no seat) and hands seats on; one is SIGKILLed mid-run. Its seats
    come back after its lease, its standbys are claimed again, every instance completes
    and the pool is never exceeded (counted from the one ``O_APPEND`` file)."""
    fr, _path, flow = _world(tmp_path, pg_url)
    log = tmp_path / "runs.log"
    n = 90
    _start(fr, flow, n, log, 0.05)
    names = ["k0", "k1", "k2"]
    with contextlib_all(fr, names, lease=4.0) as ds:
        poll(lambda: _completed(fr) >= n // 3, 120, 0.05, "a third completed")
        victim = ds[0]
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.time()
        victim.wait(30)
        poll(lambda: _completed(fr) >= n, 120, 0.1, "every instance completed")
    handed = sum(_handed(d.log()) for d in ds[1:])
    most = max(_running_after_kill(log, killed_at))
    assert most <= 2, "the pool of 2 was exceeded"
    assert most == 2, "the pool was never full: nothing was tested"
    assert handed > 0, "the survivors handed no seat on"
    starts = [line.split()[1] for line in log.read_text().splitlines() if line[0] == "S"]
    assert len(set(starts)) == n


def _running_after_kill(log: Path, killed_at: float) -> list[int]:
    """Attempts running after each start line, in file order, where an attempt the kill
    ended (its start never followed by its end before the instance's next start) stops
    counting at the first line written after the kill."""
    lines = [line.split() for line in log.read_text().splitlines()]
    orphans, open_at = set(), {}
    for k, (kind, iid, _at) in enumerate(lines):
        if kind == "S" and iid in open_at:
            orphans.add(open_at[iid])
        if kind == "S":
            open_at[iid] = k
        else:
            open_at.pop(iid, None)
    running, out, killed = set(), [], False
    for k, (kind, iid, at) in enumerate(lines):
        if not killed and float(at) >= killed_at:
            killed = True
            running -= orphans
        if kind == "S":
            running.add(k)
            out.append(len(running))
        else:
            running.discard(max(j for j in running if lines[j][1] == iid))
    return out
