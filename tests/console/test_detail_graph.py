"""The detail screen's state graph draws every way out of a state, ``on_exhausted`` too."""

from __future__ import annotations

from pathlib import Path

from runner.flowspec.compiler import load_flow
from runner.tui.model import Detail
from runner.tui.screens.detail import graph_text

FLOW = """\
initial: fetch
defaults: {error_budget: {on_exhausted: failed}}
states:
  fetch: {exec: [x], next: done, error_budget: {on_exhausted: repair}}
  check: {exec: [x], next: done}
  repair: {external: true, on: {fixed: fetch, skip: check}}
  done: {terminal: true}
"""


def test_graph_text_shows_the_on_exhausted_edge(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(FLOW)
    flow = load_flow(path)
    lines = graph_text(Detail(row={"state": "fetch"}, attempts=[], commands=[], flow=flow))
    by_state = {
        line.split()[1] if line.startswith("▶") else line.split()[0]: line
        for line in lines.plain.splitlines()
    }
    assert "→ done" in by_state["fetch"] and "on_exhausted ⇢ repair" in by_state["fetch"]
    assert "on_exhausted" not in by_state["check"]  # on_exhausted: failed draws no edge
    assert "on_exhausted" not in by_state["repair"]  # an external state spends no budget
