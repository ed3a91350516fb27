"""Routing by label with real daemons (issue 28, item 5): two daemons, one started with
``--labels gpu=1``. Instances of a state with ``runs_on: {gpu: "1"}`` run only on the
labelled daemon, unlabelled work runs on both (the ``attempts`` table names each
attempt's worker); a ``files`` sensor with ``runs_on: {host: alpha}`` is leased only by
the daemon labelled ``host=alpha`` and its instances, routed with ``runs_on: {host:
"{event.host}"}``, run there too; ``flowrun workers --json`` shows the labels. With no
matching daemon alive, ``routing_timeout`` moves the instances to its ``then`` state, and
``explain`` says what they wait for. SQLite, and the real PostgreSQL server.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from runner.flowspec.compiler import load_flow
from runner.store.create import create_instances
from runner.store.db import make_engine
from tests.support.fault import Flowrun, daemon_running, poll, sql, unique, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROUTED = """\
initial: train
states:
  train: {call: "MODULE:work", next: done, runs_on: {gpu: "1"}}
  done: {terminal: true}
"""

PLAIN = """\
initial: chores
states:
  chores: {call: "MODULE:work", next: done}
  done: {terminal: true}
"""

FILES = """\
initial: ingest
sensors:
  inbox: {files: {path: inbox}, runs_on: {host: alpha}}
rules:
  - when: inbox
    start: files_flow
    data: {path: "{event.path}"}
states:
  ingest: {call: "MODULE:work", next: done, runs_on: {host: "{event.host}"}}
  done: {terminal: true}
"""

TIMEOUT = """\
initial: train
defaults:
  runs_on: {gpu: "1"}
states:
  train:
    call: "MODULE:work"
    next: done
    routing_timeout: {after: 2s, then: fallback}
  fallback: {call: "MODULE:work", next: done, runs_on: {gpu: ""}}
  done: {terminal: true}
"""

WAITS = """\
initial: train
states:
  train: {call: "MODULE:work", next: done, runs_on: {gpu: "1"}, routing_timeout: 1h}
  done: {terminal: true}
"""

TASKS = """\
import asyncio

async def work(ctx):
    await asyncio.sleep(0.1)
    return True
"""


def _world(tmp: Path, url: str | None, flows: dict[str, str]) -> Flowrun:
    fr = Flowrun(tmp)
    if url is not None:
        fr.db = url
    module = unique("route_tasks")
    for name, body in flows.items():
        write_flow(fr.flows, name, body.replace("MODULE", module), {module: TASKS})
    return fr


def _rows(fr: Flowrun, statement: str) -> list[tuple]:
    engine = make_engine(fr.db)
    try:
        return sql(engine, statement)
    finally:
        engine.dispose()


def _start(fr: Flowrun, name: str, n: int) -> None:
    engine = make_engine(fr.db)
    try:
        with engine.begin() as conn:
            create_instances(conn, load_flow(fr.flows / f"{name}.yaml"), [{}] * n)
    finally:
        engine.dispose()


def _done(fr: Flowrun, flow: str, n: int) -> bool:
    q = f"SELECT count(*) FROM instances WHERE flow = '{flow}' AND status = 'completed'"
    return _rows(fr, q)[0][0] >= n


def _workers_of(fr: Flowrun, flow: str, state: str) -> set[str]:
    return {
        r[0]
        for r in _rows(
            fr,
            "SELECT a.worker FROM attempts a JOIN instances i ON i.id = a.instance_id"
            f" WHERE i.flow = '{flow}' AND a.state = '{state}'",
        )
    }


def _dbs():
    return ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("db", _dbs())
def test_routed_work_runs_only_on_the_labelled_daemon(tmp_path, db, request):
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    flows = {"routed": ROUTED, "plain": PLAIN, "files_flow": FILES}
    fr = _world(tmp_path, url, flows)
    (fr.flows / "inbox").mkdir()
    with contextlib.ExitStack() as stack:
        gpu = stack.enter_context(
            daemon_running(
                fr, "gpu", "--labels", "gpu=1,host=alpha", "--concurrency", "4", log="gpu"
            )
        )
        cpu = stack.enter_context(
            daemon_running(fr, "cpu", "--labels", "host=beta", "--concurrency", "4", log="cpu")
        )
        gpu_id = gpu_id_of(fr, "gpu")
        _start(fr, "routed", 30)
        _start(fr, "plain", 60)
        (fr.flows / "inbox" / "a.csv").write_text("x\n")
        poll(lambda: _done(fr, "routed", 30), 180, 0.3, "the routed instances completed")
        poll(lambda: _done(fr, "plain", 60), 180, 0.3, "the plain instances completed")
        poll(lambda: _done(fr, "files_flow", 1), 180, 0.3, "the file's instance completed")
        listed = json.loads(fr("workers", "--json").stdout)
    assert _workers_of(fr, "routed", "train") == {gpu_id}
    assert len(_workers_of(fr, "plain", "chores")) == 2  # both daemons took plain work
    assert _workers_of(fr, "files_flow", "ingest") == {gpu_id}
    [payload] = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in _payloads(fr)]
    assert payload["host"] == "alpha"
    labels = {w["id"]: w["labels"] for w in listed}
    assert labels[gpu_id] == {"gpu": "1", "host": "alpha"}
    assert {"host": "beta"} in labels.values()
    assert cpu.pid != gpu.pid


def gpu_id_of(fr: Flowrun, name: str) -> str:
    """The worker id ``daemon_running`` gave the daemon started for ``name``."""
    rows = _rows(fr, "SELECT id, labels FROM workers")
    return next(r[0] for r in rows if r[1] and '"gpu":"1"' in r[1])


def _payloads(fr: Flowrun) -> list[tuple]:
    return _rows(fr, "SELECT payload FROM events WHERE sensor = 'files_flow.inbox'")


@pytest.mark.parametrize("db", _dbs())
def test_routing_timeout_moves_what_no_live_daemon_matches(tmp_path, db, request):
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    fr = _world(tmp_path, url, {"timed": TIMEOUT, "waits": WAITS})
    with daemon_running(fr, "cpu", "--labels", "site=lyon", log="cpu"):
        _start(fr, "timed", 3)
        _start(fr, "waits", 1)
        poll(lambda: _done(fr, "timed", 3), 180, 0.3, "moved by the timeout, then completed")
        waiting = fr(
            "explain", str(_rows(fr, "SELECT id FROM instances WHERE flow = 'waits'")[0][0])
        )
    assert _workers_of(fr, "timed", "train") == set()  # never claimed where it cannot run
    assert len(_workers_of(fr, "timed", "fallback")) == 1
    routed = _rows(fr, "SELECT command, source, result FROM commands ORDER BY id")
    assert len(routed) == 3 and all(r[0] == "route" and r[1] == "routing" for r in routed)
    assert "no live worker with gpu=1" in routed[0][2] and "moved to fallback" in routed[0][2]
    assert waiting.returncode == 0, waiting.stderr
    assert "waiting for a worker with gpu=1: none ever seen" in waiting.stdout, waiting.stdout
    assert "routing_timeout moves it to failed" in waiting.stdout, waiting.stdout
    [status] = _rows(fr, "SELECT status FROM instances WHERE flow = 'waits'")
    assert status[0] == "runnable"
