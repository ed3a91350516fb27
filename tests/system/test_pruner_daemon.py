"""The daemon's pruner end to end: a real ``flowrun --daemon`` with ``--retention 1s
--prune-every 1`` on a SQLite file deletes the instances it completed, says so in its
metrics, and ``flowrun prune`` then finds nothing left to do."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.fault import Flowrun, daemon_running, poll, unique, write_flow
from tests.support.metrics import scrape

pytestmark = pytest.mark.timeout(240)


def test_daemon_prunes_completed_instances_and_counts_them(tmp_path) -> None:
    fr = Flowrun(tmp_path)
    mod, name = unique("prd_mod"), unique("prd")
    write_flow(
        fr.flows,
        name,
        f"initial: a\nstates:\n  a: {{call: '{mod}:go', next: done}}\n  done: {{terminal: true}}\n",
        {mod: "def go(ctx):\n    return True\n"},
    )
    for _ in range(20):
        assert fr("start", name).returncode == 0
    args = ("--retention", "completed=1s", "--prune-every", "1", "--metrics", "127.0.0.1:0")
    with daemon_running(fr, "pruner", *args) as daemon:

        def gone() -> bool:
            out = fr("ls", "--json")
            return out.returncode == 0 and json.loads(out.stdout) == []

        poll(gone, 120, what="completed instances pruned")  # each completed, then went
        url = re.search(r"(http://\S+/metrics)", daemon.log()).group(1)
        got = poll(
            lambda: (
                (m := scrape(url))[("flowrun_pruned_rows_total", (("kind", "instances"),))] >= 20
                and m
            ),
            60,
            what="pruned rows in the metrics",
        )
        assert got[("flowrun_pruned_rows_total", (("kind", "attempts"),))] >= 20
        assert got[("flowrun_database_bytes", ())] > 0
        # the round's line is logged once the round is over, after its counts
        poll(lambda: "pruned" in daemon.log(), 60, what="the pruner's log line")
    dry = fr("prune", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["instances"] == 0


def test_prune_command_user_mistakes_are_one_line(tmp_path) -> None:
    fr = Flowrun(tmp_path)
    fr.flows.mkdir()
    for args, code, needle in (
        (("prune", "--older-than", "soon"), 2, "invalid retention 'soon'"),
        (("prune", "--flow", "nope"), 2, "unknown flow 'nope'"),
        (("--retention", "done=1d", "prune"), 2, "STATUS=WINDOW"),
    ):
        res = fr(*args)
        assert res.returncode == code, (args, res.stderr)
        assert needle in res.stderr and "Traceback" not in res.stderr
    ok = fr("prune", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["dry_run"] is False
