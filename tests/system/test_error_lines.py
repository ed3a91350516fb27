"""The error an operator is shown is the handler's last line, not the first (cut) line of
the kept output tail: `flowrun ls`, `explain`, the console's table and detail; `show`
gives the whole kept tail. Real handler, real daemon, real SQLite file."""

from __future__ import annotations

import json

import pytest

from tests.support.fault import Flowrun, write_flow

FLOW = """\
initial: work
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  work: {exec: [python, noisy.py], next: done}
  done: {terminal: true}
"""

NOISY = """\
import sys
for i in range(100):
    print(f"noise line {i:02d}: " + "x" * 60, file=sys.stderr)
print("RuntimeError: the real cause", file=sys.stderr)
sys.exit(1)
"""

CAUSE = "exit code 1: RuntimeError: the real cause"


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Flowrun, int]:
    fr = Flowrun(tmp_path_factory.mktemp("errline"))
    write_flow(fr.flows, "noisy", FLOW, {"noisy": NOISY})
    iid = int(fr("start", "noisy").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    assert fr.show(iid)["status"] == "failed"
    return fr, iid


def test_ls_and_explain_show_the_last_line(failed) -> None:
    fr, iid = failed
    fr.env["COLUMNS"] = "200"
    table = fr("ls").stdout
    assert CAUSE in table and "noise line" not in table, table
    explained = fr("explain", str(iid)).stdout
    assert CAUSE in explained and "noise line" not in explained, explained
    # --json keeps the whole stored text
    [row] = json.loads(fr("ls", "--json").stdout)
    assert (
        row["last_error"].startswith("error budget spent") and "noise line 9" in row["last_error"]
    )


def test_show_prints_the_whole_kept_tail(failed) -> None:
    fr, iid = failed
    fr.env["COLUMNS"] = "200"
    shown = fr("show", str(iid)).stdout
    history = shown[shown.index("\nattempts") :]  # the attempts table, after last_error
    # the attempt's error: the tail's lines well past 300 characters, up to the last one
    for line in ("noise line 60", "noise line 99", "RuntimeError: the real cause"):
        assert line in history, shown


def test_console_shows_the_last_line(failed) -> None:
    from runner.store.db import make_engine
    from runner.tui.data import ConsoleData
    from runner.tui.model import Query
    from runner.tui.screens.detail import summary_text
    from runner.tui.widgets.instance_cells import cells

    fr, iid = failed
    engine = make_engine(fr.db)
    try:
        data = ConsoleData(engine, clock=lambda: 0.0, flows_dir=fr.flows)
        [row] = data.page(Query(), 0, 10).rows
        assert cells(row, 0.0, False)["error"] == CAUSE
        detail = data.detail(iid)
        assert detail is not None and CAUSE in summary_text(detail, 0.0).plain
        data.close()
    finally:
        engine.dispose()
