"""The `flowrun` command contract (docs/cli.md), run as real subprocesses on a
real SQLite file: JSON keys, exit codes, and one clear line (never a traceback) for every
user mistake."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import flowrun

FLOW = """\
flow: hello
description: two handler states and an external one
initial: greet
data: {name: nobody}
defaults: {try_interval: 1s}
states:
  greet:
    call: hello_tasks:greet
    next: shout
  shout:
    exec:
      - python
      - -c
      - "import sys; open('out-' + sys.argv[2], 'w').write(sys.argv[1])"
      - "{data.name}"
      - "{data.tag}"
    to: [parked]
    next: done
  parked:
    external: true
    on: {release: done}
  done: {terminal: true}
"""

TASKS = """\
def greet(ctx):
    ctx.data["greeted"] = True
    return "shout"
"""

INSTANCE_KEYS = {
    "id",
    "flow",
    "state",
    "status",
    "data",
    "attempts",
    "errors",
    "restarts",
    "due_at",
    "locked_by",
    "locked_until",
    "created_at",
    "updated_at",
}
HISTORY_KEYS = {
    "attempt",
    "state",
    "worker",
    "started_at",
    "finished_at",
    "outcome",
    "to_state",
    "error",
}


@pytest.fixture()
def env(tmp_path: Path) -> dict:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "hello.yaml").write_text(FLOW)
    (flows / "hello_tasks.py").write_text(TASKS)
    return {
        **os.environ,
        "FLOWRUN_FLOWS": str(flows),
        "FLOWRUN_DB": f"sqlite:///{tmp_path / 'db' / 'flowrun.db'}",
        "FLOWRUN_LEASE": "10",
        "TEST_CWD": str(tmp_path),
    }


def test_start_run_ls_show_json(env: dict, tmp_path: Path) -> None:
    first = int(flowrun(env, "start", "hello", "tag=one", "name=world").stdout)
    second = int(flowrun(env, "start", "hello", "--data", '{"tag": "two", "n": 3}').stdout)
    assert second == first + 1
    flowrun(env, "--daemon", "--exit-when-idle")
    rows = json.loads(flowrun(env, "ls", "--json").stdout)
    assert [r["id"] for r in rows] == [first, second]
    for r in rows:
        assert INSTANCE_KEYS <= set(r)
        assert (r["state"], r["status"]) == ("done", "completed")
        assert r["created_at"].endswith("Z") and "T" in r["created_at"]
        assert r["locked_by"] is None and r["due_at"] is None
    assert rows[0]["data"] == {"name": "world", "tag": "one", "greeted": True}
    assert rows[1]["data"]["name"] == "nobody"  # the flow's default data, merged under
    # the exec handler really ran, with each argument rendered on its own
    assert (Path(env["FLOWRUN_FLOWS"]) / "out-one").read_text() == "world"
    shown = json.loads(flowrun(env, "show", str(first), "--json").stdout)
    assert INSTANCE_KEYS <= set(shown)
    assert [h["outcome"] for h in shown["history"]] == ["moved", "moved"]
    assert [(h["state"], h["to_state"]) for h in shown["history"]] == [
        ("greet", "shout"),
        ("shout", "done"),
    ]
    for h in shown["history"]:
        assert HISTORY_KEYS <= set(h)
        assert h["finished_at"] >= h["started_at"]
    assert shown["budget"] is None  # a terminal state has no error budget to spend
    human = flowrun(env, "show", str(first)).stdout
    assert "error budget" not in human and "moved" in human
    only = json.loads(
        flowrun(env, "ls", "--json", "--status", "completed", "--flow", "hello").stdout
    )
    assert len(only) == 2
    assert json.loads(flowrun(env, "ls", "--json", "--status", "failed").stdout) == []


def test_injection_in_data_is_harmless(env: dict, tmp_path: Path) -> None:
    evil = "$(touch pwned); touch pwned2 `touch pwned3`"
    iid = flowrun(env, "start", "hello", f"name={evil}", "tag=evil").stdout.strip()
    flowrun(env, "--daemon", "--exit-when-idle")
    flows = Path(env["FLOWRUN_FLOWS"])
    assert (flows / "out-evil").read_text() == evil
    for name in ("pwned", "pwned2", "pwned3"):
        assert not (flows / name).exists() and not (tmp_path / name).exists()
    assert json.loads(flowrun(env, "show", iid, "--json").stdout)["status"] == "completed"


def test_user_mistakes_are_one_line(env: dict, tmp_path: Path) -> None:
    def one_line(proc: subprocess.CompletedProcess) -> str:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, proc.stderr
        return lines[0]

    assert "unknown flow 'nope'" in one_line(flowrun(env, "start", "nope", code=2))
    assert "no instance 4242" in one_line(flowrun(env, "show", "4242", code=1))
    assert "no instance 4242" in one_line(flowrun(env, "pause", "4242", code=1))
    assert "must be a JSON object" in one_line(
        flowrun(env, "start", "hello", "--data", "[]", code=2)
    )
    assert "key=value" in one_line(flowrun(env, "start", "hello", "novalue", code=2))
    bad = {**env, "FLOWRUN_DB": "postgresql+psycopg://u:hunter2@127.0.0.1:1/x"}
    line = one_line(flowrun(bad, "ls", code=2))
    assert "cannot reach database" in line and "hunter2" not in line and "***" in line
    line = one_line(flowrun({**env, "FLOWRUN_DB": "nonsense://"}, "ls", code=2))
    assert "bad database URL" in line
    line = one_line(flowrun({**env, "FLOWRUN_FLOWS": str(tmp_path / "none")}, "--daemon", code=2))
    assert "flows folder not found" in line


def test_check_reports_positions_and_exit_codes(env: dict, tmp_path: Path) -> None:
    assert "ok: 1 flow valid" in flowrun(env, "check").stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "flow: bad\ninitial: a\nstates:\n  a: {call: x:y, nxt: b}\n  b: {terminal: true}\n"
    )
    proc = flowrun(env, "check", str(bad), code=2)
    assert proc.stderr.startswith(f"{bad}:4:")
    assert "nxt" in proc.stderr


def test_send_retry_and_refusals(env: dict) -> None:
    iid = flowrun(env, "start", "hello", "tag=x").stdout.strip()
    flowrun(env, "--daemon", "--exit-when-idle")
    # completed: nothing may be resumed, sent or retried
    assert "cannot resume: instance" in flowrun(env, "resume", iid, code=1).stderr
    assert "cannot retry" in flowrun(env, "retry", iid, code=1).stderr
    flowrun(env, "send", iid, "release", code=2)
    # --flow selects only the instances the command can act on
    fresh = flowrun(env, "start", "hello", "tag=y").stdout.strip()
    out = flowrun(env, "kill", "--flow", "hello").stdout
    assert f"instance {fresh}: runnable -> killed" in out
    rows = {r["id"]: r for r in json.loads(flowrun(env, "ls", "--json").stdout)}
    assert rows[int(fresh)]["status"] == "killed"
    assert rows[int(iid)]["status"] == "completed"
    assert "can be killed" in flowrun(env, "kill", "--flow", "hello").stdout
    flowrun(env, "retry", fresh, code=1)  # killed is terminal: only failed can be retried


def test_graph_schema_events_workers(env: dict) -> None:
    mermaid = flowrun(env, "graph", "hello").stdout
    assert "stateDiagram-v2" in mermaid and "greet --> shout" in mermaid
    dot = flowrun(env, "graph", "hello", "--format", "dot").stdout
    assert dot.startswith('digraph "hello"') and '"parked" -> "done"' in dot
    schema = json.loads(flowrun(env, "schema").stdout)
    assert "states" in schema["properties"]
    flowrun(env, "--daemon", "--exit-when-idle", "--worker-id", "w-test")
    workers = json.loads(flowrun(env, "workers", "--json").stdout)
    assert [w["id"] for w in workers] == ["w-test"] and workers[0]["stopped_at"]
    for columns in ("80", "40"):  # fitted: the id and the verdict whole, times never cut
        out = flowrun({**env, "COLUMNS": columns}, "workers").stdout.splitlines()
        assert out[0].split()[0] == "id" and out[0].split()[-1] == "state", out
        assert out[1].split()[0] == "w-test" and out[1].split()[-1] == "stopped", out
        assert all(len(line) <= int(columns) for line in out), out
        assert "…" not in "\n".join(out), out
    assert workers[0]["started_at"] in flowrun({**env, "COLUMNS": "100"}, "workers").stdout
    assert json.loads(flowrun(env, "events", "--json").stdout) == []
    assert "Usage" in flowrun(env, "--help").stdout
