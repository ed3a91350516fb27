"""Operator commands against a real ``flowrun --daemon`` in another process.

One daemon serves the module; each test starts its own instances through ``flowrun
start`` and steers them with ``flowrun pause|resume|kill|retry|send``, exactly as an
operator would (a `flowrun` process costs about a second here, so waiting polls the
SQLite file directly and `flowrun show` is run once per check). Handlers are ``exec``
shell scripts that write their pids, so the tests can see a cancelled attempt's whole
process group disappear.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.store.create import create_instance
from tests.support.fault import (
    Daemon,
    Flowrun,
    attempts_of,
    engine_at,
    group_alive,
    load,
    pid_alive,
    poll,
    row,
    unique,
    write_flow,
)

pytestmark = pytest.mark.timeout(240)

# `work` runs until `release.<id>` exists: it forks a `sleep 1000` child and waits on it.
WORK = (
    'i=$FLOWRUN_INSTANCE; if [ -e "release.$i" ]; then exit 0; fi; '
    'echo $$ > "pid.$i.$FLOWRUN_ATTEMPT"; sleep 1000 & echo $! > "child.$i.$FLOWRUN_ATTEMPT"; wait'
)
# `flaky` fails (exit 3) until `ok.<id>` exists; its budget is one error: then failed.
FLAKY = 'if [ -e "ok.$FLOWRUN_INSTANCE" ]; then exit 0; fi; echo "not ok yet" >&2; exit 3'

FLOWS = {
    "live": f"""\
initial: work
defaults:
  try_interval: 200ms
  backoff: {{initial: 100ms, factor: 1, max: 100ms, jitter: none}}
states:
  work:
    exec: [sh, -c, '{WORK}']
    next: done
  done: {{terminal: true}}
""",
    "gated": """\
initial: gate
states:
  gate: {external: true, on: {go: step, skip: done}}
  step: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
""",
    "flaky": f"""\
initial: try_it
defaults:
  error_budget: {{max_errors: 1, on_exhausted: failed}}
states:
  try_it:
    exec: [sh, -c, '{FLAKY}']
    next: done
  done: {{terminal: true}}
""",
}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Flowrun, Daemon, Engine]]:
    """A flows folder, a SQLite file and one daemon (lease 10 s) for the whole module."""
    home = tmp_path_factory.mktemp("live")
    fr = Flowrun(home)
    for name, body in FLOWS.items():
        write_flow(fr.flows, name, body)
    daemon = fr.daemon("--concurrency", "8", lease=10, worker_id=unique("live"))
    poll(lambda: "started" in daemon.log(), 60, what="daemon start")
    yield fr, daemon, engine_at(home)
    daemon.signal(signal.SIGINT)
    try:
        daemon.wait(60)
    finally:
        daemon.stop()
        _kill_leftovers(fr.flows)


def _kill_leftovers(folder: Path) -> None:
    """Best-effort cleanup of handler processes a failed test may leave behind."""
    import os

    for f in folder.glob("child.*"):
        try:
            os.kill(int(f.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def start(fr: Flowrun, flow: str) -> int:
    res = fr("start", flow)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def status(db: Engine, iid: int) -> str:
    return row(db, iid)["status"]


def running_pids(fr: Flowrun, iid: int, attempt: int = 1) -> tuple[int, int]:
    """Wait until attempt ``attempt`` of ``iid`` runs; returns (leader pid, child pid)."""
    child = fr.flows / f"child.{iid}.{attempt}"
    poll(lambda: child.exists() and child.read_text().strip(), 60, what=f"{iid} running")
    return int((fr.flows / f"pid.{iid}.{attempt}").read_text()), int(child.read_text())


def outcome_of(db: Engine, iid: int, attempt: int) -> str | None:
    for a in attempts_of(db, iid):
        if a["attempt"] == attempt:
            return a["outcome"]
    return None


@pytest.mark.parametrize("command", ["pause", "kill"])
def test_pause_or_kill_cancels_the_running_exec_at_once(live, command: str) -> None:
    fr, daemon, db = live
    iid = start(fr, "live")
    leader, child = running_pids(fr, iid)
    res = fr(command, str(iid))
    assert res.returncode == 0, res.stderr
    poll(lambda: outcome_of(db, iid, 1) == "cancelled", 30, 0.1, what="attempt cancelled")
    poll(lambda: not group_alive(leader) and not pid_alive(child), 30, 0.05, what="group gone")
    shown = fr.show(iid)
    assert shown["status"] == ("paused" if command == "pause" else "killed")
    assert (shown["errors"], shown["state_errors"], shown["restarts"]) == (0, 0, 0)
    assert shown["budget"]["used"] == 0, "a cancelled attempt spends no error budget"
    assert shown["locked_by"] is None and shown["running_attempt"] is None
    assert "taken away" in daemon.log()
    if command == "kill":
        again = fr("resume", str(iid))
        assert again.returncode == 1
        assert f"cannot resume: instance {iid} is killed" in again.stderr
        return
    # resume: the instance continues (this time the handler is told to finish)
    (fr.flows / f"release.{iid}").touch()
    assert fr("resume", str(iid)).returncode == 0
    poll(lambda: status(db, iid) == "completed", 60, what="completed after resume")
    assert [h["outcome"] for h in fr.show(iid)["history"]] == ["cancelled", "moved"]


def test_retry_of_failed_resets_the_state_counters(live) -> None:
    fr, _, db = live
    iid = start(fr, "flaky")
    poll(lambda: status(db, iid) == "failed", 60, what="failed")
    shown = fr.show(iid)
    assert shown["errors"] == 1 and shown["state_errors"] == 1
    assert shown["budget"]["used"] == 1 and shown["budget"]["left"] == 0
    assert "error budget spent" in shown["last_error"] and "not ok yet" in shown["last_error"]
    assert fr("resume", str(iid)).returncode == 1, "a failed instance is not resumed"
    (fr.flows / f"ok.{iid}").touch()
    res = fr("retry", str(iid))
    assert res.returncode == 0, res.stderr
    poll(lambda: status(db, iid) == "completed", 60, what="completed after retry")
    shown = fr.show(iid)
    assert shown["errors"] == 1, "the lifetime total keeps the error"
    assert [h["outcome"] for h in shown["history"]] == ["error", "moved"]


def test_send_along_an_on_edge_and_exit_codes(live) -> None:
    fr, _, db = live
    a, b = start(fr, "gated"), start(fr, "gated")
    res = fr("send", str(a), "go")
    assert res.returncode == 0 and "gate --go--> step" in res.stdout
    poll(lambda: status(db, a) == "completed", 60, what="a completed")
    assert [h["to_state"] for h in fr.show(a)["history"]] == ["done"]

    bad = fr("send", str(b), "nope")
    assert bad.returncode == 2
    assert "events allowed here: go, skip" in bad.stderr or "allowed: go, skip" in bad.stderr
    assert "Traceback" not in bad.stderr
    done = fr("send", str(a), "go")
    assert done.returncode == 2 and f"cannot send: instance {a} is completed" in done.stderr
    unknown = fr("send", "987654", "go")
    assert unknown.returncode == 1 and "no instance 987654" in unknown.stderr
    assert fr("send", str(b), "skip").returncode == 0
    assert status(db, b) == "completed"


@pytest.mark.parametrize("command", ["pause", "resume", "kill", "retry"])
def test_unknown_id_exits_1(live, command: str) -> None:
    fr, _, db = live
    res = fr(command, "987654")
    assert res.returncode == 1
    assert res.stderr.strip() == "flowrun: no instance 987654"


def test_flow_option_acts_on_every_applicable_instance(live) -> None:
    fr, _, db = live
    with db.begin() as conn:  # setup without three `flowrun start` processes
        ids = [create_instance(conn, load(fr.flows / "live.yaml")) for _ in range(3)]
    for iid in ids:
        running_pids(fr, iid)
    finished = start(fr, "gated")
    assert fr("send", str(finished), "skip").returncode == 0

    paused = fr("pause", "--flow", "live")
    assert paused.returncode == 0, paused.stderr
    for iid in ids:
        assert f"instance {iid}: runnable -> paused" in paused.stdout
        poll(lambda iid=iid: outcome_of(db, iid, 1) == "cancelled", 30, what=f"{iid} cancelled")
    for iid in ids:
        (fr.flows / f"release.{iid}").touch()
    resumed = fr("resume", "--flow", "live")
    assert resumed.returncode == 0, resumed.stderr
    for iid in ids:
        poll(lambda iid=iid: status(db, iid) == "completed", 60, what=f"{iid} done")
    # nothing left to act on: still exit 0; the completed `gated` one is not touched
    assert fr("kill", "--flow", "live").returncode == 0
    assert fr("kill", "--flow", "gated").returncode == 0
    assert status(db, finished) == "completed"
    listed = json.loads(fr("ls", "--flow", "live", "--json").stdout)
    assert {i["id"] for i in listed} >= set(ids)
