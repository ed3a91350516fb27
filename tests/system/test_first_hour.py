"""The flow author's first hour, through the real `flowrun` command: `init`, read-only
commands that never create a database (listings list nothing, exit 0), `start` from the
last good version of a broken flow, `check FILE` resolving cross-references, the daemon with
no flows, labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HR = """\
flow: hr
label: "{data.path}"
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""


def flowrun(cwd: Path, *args: str, code: int = 0, env: dict | None = None):
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli", *args],
        env={**os.environ, "FLOWRUN_LEASE": "10", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def test_init_writes_a_runnable_example_and_refuses_twice(tmp_path: Path) -> None:
    out = flowrun(tmp_path, "init", "proj").stdout
    flows = tmp_path / "proj" / "flows"
    text = (flows / "hello.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=../schemas/flow.schema.json\n")
    assert (tmp_path / "proj" / "schemas" / "flow.schema.json").is_file()
    assert (flows / "hello_tasks.py").is_file() and (flows / "inbox").is_dir()
    assert "next: cd proj && flowrun --daemon" in out
    err = flowrun(tmp_path, "init", "proj", code=2).stderr
    assert "already has flows" in err and len(err.strip().splitlines()) == 1
    assert (flows / "hello.yaml").read_text() == text
    project = tmp_path / "proj"
    assert "ok: 1 flow valid" in flowrun(project, "check").stdout
    (flows / "inbox" / "a.txt").write_text("hi there\n")
    iid = flowrun(project, "start", "hello", f"path={flows / 'inbox' / 'b.txt'}").stdout.strip()
    closing = flowrun(project, "--daemon", "--exit-when-idle").stderr.strip().splitlines()[-1]
    # the last line in a user's words (two instances: the file's and the one started)
    assert "done: 2 attempts committed, 2 instances claimed" in closing, closing
    assert "chained" not in closing and "lost_fence" not in closing
    row = json.loads(flowrun(project, "show", iid, "--json").stdout)
    assert (row["state"], row["label"]) == ("review", "inbox/b.txt")


def test_read_only_commands_do_not_create_a_database(tmp_path: Path) -> None:
    # acting on or showing an instance of a database that does not exist: exit 1
    for args in (["show", "1"], ["pause", "1"], ["events", "replay", "1"]):
        err = flowrun(tmp_path, *args, code=1).stderr
        assert err.startswith("flowrun: no database at .flowrun/flowrun.db"), err
        assert len(err.strip().splitlines()) == 1
    # listing nothing is not an error: an empty list, exit 0, one note naming the file
    for args in (["ls"], ["ls", "--json"], ["events"], ["events", "--json"], ["workers"]):
        proc = flowrun(tmp_path, *args)
        err = proc.stderr
        assert err.startswith("flowrun: no database at .flowrun/flowrun.db yet"), err
        assert len(err.strip().splitlines()) == 1
        if "--json" in args:
            assert json.loads(proc.stdout) == []
    assert json.loads(flowrun(tmp_path, "workers", "--json").stdout) == []
    assert "0 instances" in flowrun(tmp_path, "ls").stdout
    assert not (tmp_path / ".flowrun").exists()


def test_daemon_without_flows_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    err = flowrun(tmp_path, "--daemon", "--exit-when-idle").stderr
    assert "no flows in flows: `flowrun init` writes an example" in err


def test_start_uses_the_last_good_version_of_a_broken_flow(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "hr.yaml").write_text(HR)
    first = flowrun(tmp_path, "start", "hr", "path=/data/in/2024/jan.csv").stdout.strip()
    (flows / "hr.yaml").write_text(HR.replace("initial: wait", "initial: wiat"))
    proc = flowrun(tmp_path, "start", "hr", "path=/x/y/z.csv")
    assert int(proc.stdout) == int(first) + 1
    lines = proc.stderr.splitlines()
    assert lines[0] == "flowrun: flows/hr.yaml has errors:"
    assert lines[1].startswith("  flows/hr.yaml:3:10: initial state 'wiat'")
    assert "starting hr from its last good version" in lines[-1]
    rows = json.loads(flowrun(tmp_path, "ls", "--json").stdout)
    assert [(r["state"], r["label"]) for r in rows] == [
        ("wait", "2024/jan.csv"),
        ("wait", "y/z.csv"),
    ]
    assert len({r["data"]["path"] for r in rows}) == 2
    table = flowrun(tmp_path, "ls").stdout
    assert "label" in table.splitlines()[0] and "2024/jan.csv" in table and "y/z.csv" in table
    shown = flowrun(tmp_path, "show", first).stdout
    assert "label  2024/jan.csv" in shown
    found = json.loads(flowrun(tmp_path, "ls", "--json", "--search", "JAN.csv").stdout)
    assert [r["id"] for r in found] == [int(first)]
    # a broken flow never stored: its errors, then one line, exit 2
    (flows / "pay.yaml").write_text("flow: pay\ninitial: [\n")
    proc = flowrun(tmp_path, "start", "pay", code=2)
    assert "has errors" in proc.stderr and "no good version of it is stored" in proc.stderr


@pytest.mark.parametrize("where", ["flows folder", "own folder"])
def test_check_file_resolves_cross_references(tmp_path: Path, where: str) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    drafts = tmp_path / "drafts"
    drafts.mkdir()
    starter = drafts / "starter.yaml"
    starter.write_text(
        "flow: starter\ninitial: wait\nstates:\n  wait: {external: true, on: {go: done}}\n"
        "  done: {terminal: true}\nsensors:\n  clk: {every: 1h}\n"
        "rules:\n  - {when: clk, start: hr}\n"
    )
    proc = flowrun(tmp_path, "check", str(starter), code=2)
    assert proc.stderr.startswith(f"{starter}:9:")
    assert "unknown flow 'hr'" in proc.stderr
    (flows if where == "flows folder" else drafts).joinpath("hr.yaml").write_text(HR)
    assert "ok: 1 flow valid" in flowrun(tmp_path, "check", str(starter)).stdout


THREE_MISTAKES = """\
flow: three
initial: fetch
states:
  fetch:
    exec: [python, fetch.py]
    timout: 5m
    next: parse
  parse:
    call: no_such_module:parse
    next: dnoe
  done: {terminal: true}
"""


def test_check_reports_every_independent_mistake_of_a_file_at_once(tmp_path: Path) -> None:
    """A field error (schema), a target that is not a state (graph) and a call that does
    not import: one run of `check` names all three, each at its place, exit 2."""
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "three.yaml").write_text(THREE_MISTAKES)
    err = flowrun(tmp_path, "check", code=2).stderr.strip().splitlines()
    assert err[0].startswith("flows/three.yaml:6:5: unknown key 'timout' (did you mean 'timeout'?")
    assert err[1].startswith("flows/three.yaml:9:11: cannot import module 'no_such_module'")
    assert err[2].startswith("flows/three.yaml:10:11: next 'dnoe' is not a state of this flow")
    # and what `done` being unreachable follows from: the same run, nothing invented
    assert err[3:] == [
        "flows/three.yaml:11:3: state 'done' is unreachable from initial state 'fetch'"
    ]
    # fixed one by one, each fix removes exactly its line
    (flows / "three.yaml").write_text(THREE_MISTAKES.replace("timout", "timeout"))
    assert len(flowrun(tmp_path, "check", code=2).stderr.strip().splitlines()) == 3


BROKEN_AND_CROSS = """\
flow: two
initial: wait
states:
  wait:
    external: true
    on: {go: done}
    timout: 5m
  done: {terminal: true}
sensors:
  clk: {every: 1h}
rules:
  - {when: clk, start: nosuchflow}
  - {when: clk, send: {flow: hr, event: nope}}
"""


@pytest.mark.parametrize("how", ["folder", "file"])
def test_check_reports_cross_flow_mistakes_of_a_file_with_field_errors(
    tmp_path: Path, how: str
) -> None:
    """A field error and two rules naming what the other flows do not have (a flow, an
    event): one run of `check` names all three, each at its place (the cross-flow checks
    run on what of the file validated)."""
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "hr.yaml").write_text(HR)
    (flows / "two.yaml").write_text(BROKEN_AND_CROSS)
    args = ["check"] if how == "folder" else ["check", "flows/two.yaml"]
    err = flowrun(tmp_path, *args, code=2).stderr.strip().splitlines()
    assert len(err) == 3, err
    assert err[0].startswith("flows/two.yaml:7:5: unknown key 'timout'")
    assert err[1].startswith("flows/two.yaml:12:24: unknown flow 'nosuchflow'")
    assert err[2].startswith("flows/two.yaml:13:41: no state of flow 'hr' accepts event 'nope'")
    # a flow name left out for its error (the stem 'two' stands in) invents no clash
    # with another file's flow 'two'
    (flows / "two.yaml").write_text(BROKEN_AND_CROSS.replace("flow: two", "flow: 2two"))
    (flows / "other.yaml").write_text(HR.replace("flow: hr", "flow: two"))
    err = flowrun(tmp_path, *args, code=2).stderr.strip().splitlines()
    assert err[0].startswith("flows/two.yaml:1:7: ") and len(err) == 4, err
    assert not any("already defined" in line for line in err), err
    # no flow: at all: the stem is the name, and the clash is a mistake of its own
    (flows / "two.yaml").write_text(BROKEN_AND_CROSS.replace("flow: two\n", ""))
    err = flowrun(tmp_path, *args, code=2).stderr.strip().splitlines()
    assert err[0] == "flows/two.yaml:1:1: flow 'two' is already defined in other.yaml", err
    assert len(err) == 4, err
