"""runner.flowspec.registry.FlowRegistry: folder loading, cross-flow checks, hot reload."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from runner.errors import UserError
from runner.flowspec.registry import FlowRegistry

A = """\
initial: a
states:
  a: {exec: [x], next: done}
  done: {terminal: true}
sensors:
  tick: {every: 1m}
rules:
  - when: tick
    start: b
"""
B = """\
flow: b
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def where(errors) -> list[str]:
    return [f"{Path(e.file).name}:{e.line}:{e.col}: {e.message}" for e in errors]


def test_load_all_and_get(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", A)
    write(tmp_path, "other_name.yml", B)
    write(tmp_path, "notes.txt", "not a flow")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "c.yaml", "nonsense: [")  # not recursive
    reg = FlowRegistry(tmp_path)
    assert reg.load_all() == []
    assert sorted(reg.flows) == ["a", "b"] and reg.errors == {}
    assert reg.get("b").path == str(tmp_path / "other_name.yml")
    assert set(reg.by_path) == {str(tmp_path / "a.yaml"), str(tmp_path / "other_name.yml")}
    with pytest.raises(UserError) as info:
        reg.get("nope")
    assert str(info.value) == "unknown flow 'nope' (known: a, b)" and info.value.exit_code == 2


def test_folder_on_sys_path_once(tmp_path: Path) -> None:
    FlowRegistry(tmp_path)
    FlowRegistry(tmp_path)
    assert sys.path.count(str(tmp_path.resolve())) == 1


def test_start_of_unknown_flow(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", A.replace("start: b", "start: bb"))
    write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    errs = reg.load_all()
    assert where(errs) == ["a.yaml:9:12: unknown flow 'bb' (did you mean 'b'?) (known: a, b)"]
    assert sorted(reg.flows) == ["b"]
    assert list(reg.errors) == [str(tmp_path / "a.yaml")]


def test_rules_aimed_at_other_flows(tmp_path: Path) -> None:
    rules = A.split("rules:")[0] + textwrap.dedent("""\
        rules:
          - {when: tick, send: {event: go, flow: b}}
          - {when: tick, send: {event: stop, flow: b, state: wait}}
          - {when: tick, pause: {flow: b, state: wiat}}
          - {when: tick, kill: {flow: zzz}}
        """)
    write(tmp_path, "a.yaml", rules)
    write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    assert where(reg.load_all()) == [
        "a.yaml:9:32: no state of flow 'b' accepts event 'stop' (events: go)",
        "a.yaml:10:42: flow 'b' has no state 'wiat' (did you mean 'wait'?)",
        "a.yaml:11:31: unknown flow 'zzz' (known: a, b)",
    ]


def test_duplicate_flow_names(tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", B)
    write(tmp_path, "c.yaml", B)
    reg = FlowRegistry(tmp_path)
    assert where(reg.load_all()) == ["c.yaml:1:7: flow 'b' is already defined in b.yaml"]
    assert reg.get("b").path == str(tmp_path / "b.yaml")
    # the stem-named duplicate points at the top of the file
    write(tmp_path, "d.yaml", "initial: a\nstates: {a: {terminal: true}}\n")
    write(tmp_path, "e.yaml", "flow: d\ninitial: a\nstates: {a: {terminal: true}}\n")
    assert where(reg.load_all())[-1] == "e.yaml:1:7: flow 'd' is already defined in d.yaml"


def test_hot_reload_keeps_good_version(tmp_path: Path) -> None:
    path = write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    assert reg.load_all() == []
    good = reg.get("b")
    path.write_text(B.replace("on: {go: done}", "on: {go: dnoe}") + "bogus: 1\n")
    errs = reg.reload([path])
    assert where(errs) == [  # every mistake at once: the field error and the graph's
        "b.yaml:4:35: on: go -> 'dnoe' is not a state of this flow (did you mean 'done'?) "
        "(states: wait, done)",
        "b.yaml:5:3: state 'done' is unreachable from initial state 'wait'",
        "b.yaml:6:1: unknown key 'bogus' (expected one of: flow, description, label, initial, "
        "data, defaults, states, sensors, rules, pools, on_failure, priority, max_running, "
        "on_limit, deadline, retention)",
    ]
    assert reg.get("b") is good  # the good version stays in force
    assert reg.errors[str(path)] == errs
    # fixed: the new version replaces it and the errors are gone
    path.write_text(B.replace("go: done", "go: done, stop: done"))
    assert reg.reload([str(path)]) == []
    assert reg.get("b") is not good and reg.get("b").version != good.version
    assert reg.errors == {}


def test_reload_only_touches_given_files(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", A)
    b = write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    reg.load_all()
    flow_a = reg.get("a")
    b.write_text(B + "description: edited\n")
    a.write_text("broken: [")  # not reloaded: stays as it was
    assert reg.reload([b, tmp_path / "notes.txt", "/elsewhere/x.yaml"]) == []
    assert reg.get("a") is flow_a and reg.get("b").description == "edited"


def test_deleted_file_removes_its_flow(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", A)
    b = write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    reg.load_all()
    b.unlink()
    errs = reg.reload([b])
    assert sorted(reg.flows) == ["a"]
    # a still runs, but its rule now names a flow that is gone: reported against a
    assert where(errs) == ["a.yaml:9:12: unknown flow 'b' (known: a)"]
    assert list(reg.errors) == [str(a)]
    a.unlink()
    reg.reload([a])
    assert reg.flows == {} and reg.errors == {}


def test_new_file_with_cross_errors_is_rejected(tmp_path: Path) -> None:
    write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    reg.load_all()
    a = write(tmp_path, "a.yaml", A.replace("start: b", "start: q"))
    assert len(reg.reload([a])) == 1
    assert sorted(reg.flows) == ["b"]
    a.write_text(A)
    assert reg.reload([a]) == [] and sorted(reg.flows) == ["a", "b"]


def test_stale_names_files_changed_since_read(tmp_path: Path) -> None:
    """What a watcher started after the load would miss: edits, new and deleted files."""
    a = write(tmp_path, "a.yaml", A)
    b = write(tmp_path, "b.yaml", B)
    reg = FlowRegistry(tmp_path)
    reg.load_all()
    assert reg.stale() == []
    b.write_text(B + "description: edited\n")
    c = write(tmp_path, "c.yaml", B.replace("flow: b", "flow: c"))
    a.unlink()
    (tmp_path / "notes.txt").write_text("not a flow")
    assert reg.stale() == [str(a), str(b), str(c)]
    assert reg.reload(reg.stale()) == []
    assert reg.stale() == [] and sorted(reg.flows) == ["b", "c"]
    b.write_text("broken: [")  # read with errors: read all the same, so not stale
    assert reg.reload([b]) and reg.stale() == []
