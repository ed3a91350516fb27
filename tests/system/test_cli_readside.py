"""What `flowrun ls`, `show` and `send` print for a person, run as real subprocesses on a
real SQLite file: the id and status always show at 80 columns (and piped without
``COLUMNS``), the due column never says ``event`` for a paused instance nor a negative
time, ``show`` prints checkpoints and no budget in a terminal state, and a refused
``send`` lists the allowed events once."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.support.cli import flowrun

FLOW = """\
flow: invoice_reconciliation_nightly
description: long names, a long error, a checkpoint and an external state
initial: download_bank_statements
defaults:
  try_interval: 1s
  error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}
states:
  download_bank_statements:
    call: recon_tasks:download
    to: [awaiting_manual_approval, reconcile_every_statement_line]
  reconcile_every_statement_line:
    exec:
      - python
      - -c
      - "import sys; sys.exit(sys.argv[1])"
      - the statement server refused the connection, certificate expired for the host
    next: done
  awaiting_manual_approval:
    external: true
    on: {approve: done, reject: done}
  done: {terminal: true}
"""

TASKS = """\
def download(ctx):
    ctx.checkpoint({"downloaded_rows": 1234})
    return ctx.data.get("go", "awaiting_manual_approval")
"""


@pytest.fixture()
def env(tmp_path: Path) -> dict:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "recon.yaml").write_text(FLOW)
    (flows / "recon_tasks.py").write_text(TASKS)
    out = {
        **os.environ,
        "FLOWRUN_FLOWS": str(flows),
        "FLOWRUN_DB": f"sqlite:///{tmp_path / 'db' / 'flowrun.db'}",
        "FLOWRUN_LEASE": "10",
        "TEST_CWD": str(tmp_path),
    }
    out.pop("COLUMNS", None)
    return out


def _world(env: dict) -> dict[str, int]:
    """Instances in every interesting situation: parked (external state), failed with a
    long error, paused while parked, and runnable but not yet run."""
    name = "invoice_reconciliation_nightly"
    ids = {
        "parked": int(flowrun(env, "start", name).stdout),
        "failed": int(flowrun(env, "start", name, "go=reconcile_every_statement_line").stdout),
        "paused": int(flowrun(env, "start", name).stdout),
    }
    flowrun(env, "--daemon", "--exit-when-idle")
    flowrun(env, "pause", str(ids["paused"]))
    ids["waiting"] = int(flowrun(env, "start", name).stdout)
    return ids


def _table(stdout: str) -> dict[int, str]:
    """The data lines of `ls` text by id (the first field must be the id)."""
    lines = stdout.splitlines()
    assert lines[0].split()[:1] == ["id"], lines[0]
    assert re.fullmatch(r"\d+ instances?", lines[-1]), lines[-1]
    out = {}
    for line in lines[1:-1]:
        first = line.split()[0]
        assert first.isdigit(), f"the id does not lead the line: {line!r}"
        out[int(first)] = line
    return out


def test_ls_keeps_id_and_status_at_80_columns_and_says_when_due(env: dict) -> None:
    ids = _world(env)
    rows = {r["id"]: r for r in json.loads(flowrun(env, "ls", "--json").stdout)}
    statuses = {k: rows[i]["status"] for k, i in ids.items()}
    assert statuses == {
        "parked": "runnable",
        "failed": "failed",
        "paused": "paused",
        "waiting": "runnable",
    }
    for columns in ("80", None, "60", "40"):  # None: piped without COLUMNS
        e = env if columns is None else {**env, "COLUMNS": columns}
        out = flowrun(e, "ls").stdout
        for line in out.splitlines():
            assert len(line) <= int(columns or 80), (columns, line)
        table = _table(out)
        assert set(table) == set(rows), (columns, out)
        header = out.splitlines()[0]
        assert "status" in header.split()
        for iid, line in table.items():
            assert rows[iid]["status"] in line.split(), (columns, line)
    wide = _table(flowrun({**env, "COLUMNS": "250"}, "ls").stdout)
    assert "exit code 1: " in wide[ids["failed"]], "a wide terminal shows the error"
    due = {k: wide[i].split()[7] for k, i in ids.items()}  # id flow state status a e r due
    assert due == {"parked": "on", "failed": "-", "paused": "-", "waiting": "now"}, due
    # an instance in an external state says which events it waits for
    assert " on approve|reject " in wide[ids["parked"]], wide[ids["parked"]]


def test_ls_limit_prints_the_newest_in_id_order(env: dict) -> None:
    ids = [int(flowrun(env, "start", "invoice_reconciliation_nightly").stdout) for _ in range(4)]
    assert [r["id"] for r in json.loads(flowrun(env, "ls", "--json", "--limit", "2").stdout)] == (
        ids[-2:]
    )
    assert list(_table(flowrun(env, "ls", "--limit", "3").stdout)) == ids[-3:]


def test_show_prints_checkpoints_and_budget_only_where_one_is_spent(env: dict) -> None:
    ids = _world(env)
    parked = flowrun(env, "show", str(ids["parked"])).stdout
    assert "checkpoint" in parked and '"downloaded_rows": 1234' in parked, parked
    assert "error budget" in parked, "a state that may still run shows its budget"
    iid = ids["parked"]
    assert f"waits for  an event: flowrun send {iid} approve, flowrun send {iid} reject" in parked
    shown = json.loads(flowrun(env, "show", str(ids["parked"]), "--json").stdout)
    assert shown["waits_for"] == ["approve", "reject"]
    explained = flowrun(env, "explain", str(iid)).stdout
    assert "waits for an event: approve or reject" in explained.splitlines()[0], explained
    for k in ("paused", "waiting", "failed"):  # none of them waits for an event
        assert json.loads(flowrun(env, "show", str(ids[k]), "--json").stdout)["waits_for"] is None
        assert "waits for" not in flowrun(env, "show", str(ids[k])).stdout
    assert shown["checkpoints"] == [
        {"attempt": 1, "state": "download_bank_statements", "checkpoint": {"downloaded_rows": 1234}}
    ]
    flowrun(env, "send", str(ids["parked"]), "approve")
    flowrun(env, "--daemon", "--exit-when-idle")
    done = json.loads(flowrun(env, "show", str(ids["parked"]), "--json").stdout)
    assert (done["state"], done["status"], done["budget"]) == ("done", "completed", None)
    assert "error budget" not in flowrun(env, "show", str(ids["parked"])).stdout


def test_send_refusal_lists_the_allowed_events_once(env: dict) -> None:
    ids = _world(env)
    err = flowrun(env, "send", str(ids["parked"]), "aprove", code=2).stderr
    assert err.count("approve") == 1 and err.count("reject") == 1, err
    assert len(err.strip().splitlines()) == 1, err
    flowrun(env, "send", "4242", "approve", code=1)


LABELLED = """\
flow: intake
label: "{data.path}"
initial: check
data: {why: ""}
defaults:
  try_interval: 1s
  error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}
states:
  check:
    exec: [python, -c, "import sys; sys.exit(sys.argv[1] or None)", "{data.why}"]
    next: quarantine
  quarantine:
    external: true
    on: {release: check, discard: done}
  done: {terminal: true}
"""


def test_ls_and_show_at_80_columns_keep_labels_errors_and_times(env: dict) -> None:
    """At 80 columns ``ls`` keeps each label whole and the last error; ``show`` keeps
    each attempt's start time whole."""
    (Path(env["FLOWRUN_FLOWS"]) / "intake.yaml").write_text(LABELLED)
    ids = [
        int(flowrun(env, "start", "intake", f"path=/srv/inbox/seattle-2026-11-2{d}.csv").stdout)
        for d in (7, 8)
    ]
    why = "the upstream server refused the file: checksum mismatch"
    failed = int(flowrun(env, "start", "intake", "path=/srv/inbox/x.csv", f"why={why}").stdout)
    flowrun(env, "--daemon", "--exit-when-idle")
    e80 = {**env, "COLUMNS": "80"}
    out = flowrun(e80, "ls").stdout
    assert all(len(line) <= 80 for line in out.splitlines()), out
    header = out.splitlines()[0]
    assert header.startswith("id ") and "label" in header and "last error" in header, header
    table = _table(out)
    assert "inbox/seattle-2026-11-27.csv" in table[ids[0]], out
    assert "inbox/seattle-2026-11-28.csv" in table[ids[1]], out
    assert "exit code 1: the upstre" in table[failed] and "failed" in table[failed].split(), out
    assert "runnable" in table[ids[0]].split()
    # waiting in quarantine: due on one of its events, never cut
    wide = _table(flowrun({**env, "COLUMNS": "100"}, "ls").stdout)
    assert all(" on release|discard" in wide[iid] for iid in ids), wide
    for iid in (failed, *ids):
        shown = json.loads(flowrun(env, "show", str(iid), "--json").stdout)
        text = flowrun(e80, "show", str(iid)).stdout
        assert all(len(line) <= 80 for line in text.splitlines()), text
        for attempt in shown["history"]:
            assert attempt["started_at"] in text, text
    # narrower still, each attempt keeps its number and outcome (rich dropped them)
    text = flowrun({**env, "COLUMNS": "40"}, "show", str(failed)).stdout.splitlines()
    head = text.index("attempts") + 1
    assert text[head].split()[:2] == ["#", "state"] and "outcome" in text[head], text
    assert text[head + 1].split()[:3] == ["1", "check", "error"], text
