"""Pools in flow files: ``pools``, ``pool`` and ``slots`` checked in one file
(``runner.flowspec.checks``) and across the folder (``runner.flowspec.pool_checks``:
two files declaring one pool differently is an error at both declarations)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import FlowErrors
from runner.flowspec.compiler import compile_source
from runner.flowspec.registry import FlowRegistry

ROOT = Path(__file__).resolve().parents[3]

LOADS = """\
initial: load
pools: {warehouse: 2}
states:
  load: {exec: [x], pool: warehouse, next: done}
  done: {terminal: true}
"""
OTHER = """\
flow: other
initial: copy
pools:
  warehouse: 3
states:
  copy: {exec: [x], pool: warehouse, slots: 2, next: done}
  done: {terminal: true}
"""


def messages(folder: Path) -> list[str]:
    errors = FlowRegistry(folder).load_all()
    return sorted(f"{Path(e.file).name}:{e.line}:{e.col}: {e.message}" for e in errors)


def test_a_pooled_state_compiles_with_its_pool_and_slots() -> None:
    flow = compile_source(LOADS, "loads.yaml")
    assert flow.pools == {"warehouse": 2}
    assert (flow.states["load"].pool, flow.states["load"].slots) == ("warehouse", 1)
    assert flow.states["done"].pool is None


def test_two_files_declaring_one_pool_differently_is_an_error_at_both(tmp_path: Path) -> None:
    (tmp_path / "loads.yaml").write_text(LOADS)
    (tmp_path / "other.yaml").write_text(OTHER)
    assert messages(tmp_path) == [
        "loads.yaml:2:20: pool 'warehouse' is declared with 2 slots here and differently "
        "in other.yaml (3 slots): every file declaring a pool declares it alike",
        "other.yaml:4:14: pool 'warehouse' is declared with 3 slots here and differently "
        "in loads.yaml (2 slots): every file declaring a pool declares it alike",
    ]
    (tmp_path / "other.yaml").write_text(OTHER.replace("warehouse: 3", "warehouse: 2"))
    assert messages(tmp_path) == []


def test_a_pool_declared_in_another_file_is_known_there(tmp_path: Path) -> None:
    (tmp_path / "loads.yaml").write_text(LOADS)
    uses = OTHER.replace("pools:\n  warehouse: 3\n", "").replace("slots: 2", "slots: 3")
    (tmp_path / "other.yaml").write_text(uses)
    assert messages(tmp_path) == [
        "other.yaml:4:45: state 'copy' takes 3 slots of pool 'warehouse', which has 2"
    ]
    (tmp_path / "other.yaml").write_text(uses.replace("pool: warehouse", "pool: wherehouse"))
    assert messages(tmp_path) == [
        "other.yaml:4:27: unknown pool 'wherehouse' (did you mean 'warehouse'?): declare it "
        "under 'pools' in a flow file (pools: {wherehouse: N})"
    ]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("{exec: [x], slots: 2, next: done}", "slots needs pool: the slots of which pool?"),
        ("{exec: [x], pool: warehouse, slots: 3, next: done}", "takes 3 slots of pool"),
        ("{external: true, pool: warehouse, on: {go: done}}", "pool needs a handler"),
        ("{exec: [x], pool: warehouse, slots: 0, next: done}", "greater than or equal to 1"),
    ],
)
def test_one_files_mistakes(state: str, message: str) -> None:
    source = LOADS.replace("{exec: [x], pool: warehouse, next: done}", state)
    with pytest.raises(FlowErrors) as caught:
        compile_source(source, "loads.yaml")
    assert message in str(caught.value)


def test_check_reports_both_positions_in_one_line_each(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "loads.yaml").write_text(LOADS)
    (flows / "other.yaml").write_text(OTHER)
    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--flows", str(flows), "check"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if "pool 'warehouse'" in line]
    assert len(lines) == 2 and "Traceback" not in proc.stderr
    assert sorted(line.split(": pool")[0].rsplit("/", 1)[-1] for line in lines) == [
        "loads.yaml:2:20",
        "other.yaml:4:14",
    ]
