"""Service log lines: the fenced-out WARNING names the instance, its flow and state and
its holder now (or says it was killed);
JSON lines carry the fields as keys; the status and progress figures."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

from runner.engine import cycle
from runner.engine.cycle import WorkerStats
from runner.handlers.attempt import AttemptResult
from runner.service.logs import JsonFormatter, TextFormatter
from runner.service.progress import Progress, closing_line, status_loop
from runner.store import leases
from tests.support.fault import engine_at, load, new_instance, sql, write_flow

FLOW = """\
initial: work
states:
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


def _fenced_out(tmp_path: Path, caplog, taken: str) -> tuple[int, logging.LogRecord]:
    """Worker-a's finished attempt, its instance changed meanwhile by ``taken`` (an
    UPDATE bumping the fence): the cycle's one WARNING record."""
    flow = load(write_flow(tmp_path / "flows", "fence", FLOW))
    engine = engine_at(tmp_path)
    iid = new_instance(engine, flow)
    with engine.begin() as conn:
        (claim,) = leases.claim_batch(conn, "worker-a", 30.0, 10)
    sql(engine, f"UPDATE instances SET {taken}, fence=fence+1 WHERE id=:i", i=iid)
    run = SimpleNamespace(claim=claim, durable=[claim.data])
    request = cycle.decide_finished(
        engine,
        [(run, AttemptResult("moved", {}, to_state="done"))],
        cycle.CycleRequest("worker-a", 30.0),
        stopping=False,
    )
    with caplog.at_level(logging.WARNING, "flowrun.worker"):
        assert cycle.run_cycle(engine, request).lost == [iid]
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    return iid, record


def test_fenced_out_commit_names_instance_flow_and_holder(tmp_path: Path, caplog) -> None:
    # another worker takes the instance over (its lease "expired")
    iid, record = _fenced_out(tmp_path, caplog, "locked_by='worker-b'")
    assert record.getMessage() == (
        f"instance {iid} (flow fence, state work): fenced out: the outcome of attempt 1 was "
        "not committed by worker-a; held now by worker-b"
    )
    out = json.loads(JsonFormatter().format(record))
    assert (out["instance"], out["flow"], out["state"], out["kind"]) == (
        iid,
        "fence",
        "work",
        "fenced_out",
    )
    assert (out["worker"], out["holder"]) == ("worker-a", "worker-b")


def test_fenced_out_by_a_kill_says_killed(tmp_path: Path, caplog) -> None:
    iid, record = _fenced_out(tmp_path, caplog, "status='killed', locked_by=NULL")
    assert record.getMessage() == (
        f"instance {iid} (flow fence, state work): killed by a command; the outcome of "
        "attempt 1 was not committed"
    )
    assert json.loads(JsonFormatter().format(record))["kind"] == "killed"


def test_progress_figures() -> None:
    p = Progress({"completed": 5, "runnable": 10}, now=0.0)
    p.update({"completed": 9, "failed": 1, "runnable": 5})
    assert (p.done, p.total) == (5, 10)
    assert p.rate(10.0) == 0.5 and p.eta(10.0) == 10.0
    assert p.line(10.0) == "progress: 5/10 done, 0.5/s, ETA 10s"


def test_closing_line_in_a_users_words() -> None:
    quiet = WorkerStats(claimed=1, committed=1)
    assert closing_line(quiet) == "done: 1 attempt committed, 1 instance claimed"
    busy = WorkerStats(
        claimed=5, chained=3, committed=9, cancelled=1, lost_fence=2, recovered=1, handed=4
    )
    assert closing_line(busy) == (
        "done: 9 attempts committed (1 cancelled), 5 instances claimed, 3 attempts run on in "
        "the next state without a new claim, 4 pool seats handed from an ended attempt to a "
        "standby claim, 2 outcomes not committed (the instance was taken "
        "away by a command or another worker), 1 attempt of dead workers recorded as lost"
    )


async def test_status_line(tmp_path: Path, caplog) -> None:
    flow = load(write_flow(tmp_path / "flows", "status", FLOW))
    engine = engine_at(tmp_path)
    for _ in range(3):
        new_instance(engine, flow)
    committed = {"n": 0}
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, "flowrun.daemon"):
        task = asyncio.ensure_future(status_loop(engine, lambda: committed["n"], stop, 0.2))
        committed["n"] = 10
        deadline = time.monotonic() + 30
        while not any("status:" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 10)
    line = next(r.getMessage() for r in caplog.records if "status:" in r.getMessage())
    assert line.startswith("status: runnable 3; ") and line.endswith("attempts/s")


def test_text_log_lines_show_outside_text_literally() -> None:
    """A worker id, file name or error line with escape sequences or markup reaches the
    terminal reading the log escaped; JSON lines keep the exact text."""
    record = logging.LogRecord(
        "flowrun.worker", logging.WARNING, __file__, 1, "worker %s started", ("w[b]x\x1b[2J",), None
    )
    line = TextFormatter().format(record)
    assert line.endswith("worker w[b]x\\x1b[2J started") and "\x1b" not in line
    assert json.loads(JsonFormatter().format(record))["msg"] == "worker w[b]x\x1b[2J started"
