"""``flowrun explain`` on instances of the example flow (``flows/csv_ingest.yaml``) run by a
real ``flowrun --daemon`` on a real SQLite file.

One daemon serves the module. A good CSV dropped into the inbox is started by the rule and
completes; a missing file errs three times (backoff 1 and 2, then the budget is spent:
failed); a defective file waits in ``quarantine`` for an operator's ``send``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault import Daemon, Flowrun, daemon_running, engine_at, poll, row

pytestmark = pytest.mark.timeout(240)

EXAMPLE = Path(__file__).resolve().parents[2] / "flows"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Flowrun, Daemon]]:
    """The example flows folder (empty inbox) and one daemon running it."""
    home = tmp_path_factory.mktemp("explain")
    shutil.copytree(
        EXAMPLE,
        home / "flows",
        ignore=shutil.ignore_patterns("inbox", "archive", "__pycache__", "*.pyc"),
    )
    (home / "flows" / "inbox").mkdir()
    fr = Flowrun(home)
    with daemon_running(fr, "explain") as daemon:
        yield fr, daemon


def _explain(fr: Flowrun, iid: int) -> tuple[str, dict]:
    text = fr("explain", str(iid))
    assert text.returncode == 0, text.stderr
    data = fr("explain", str(iid), "--json")
    assert data.returncode == 0, data.stderr
    return text.stdout, json.loads(data.stdout)


def _start(fr: Flowrun, *pairs: str) -> int:
    res = fr("start", "csv_ingest", *pairs)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def test_completed_file_started_by_the_rule(example) -> None:
    fr, _ = example
    (fr.flows / "inbox" / "good.csv").write_text("city,pop\nParis,2100000\nLyon,520000\n")
    db = engine_at(fr.home)
    ids = poll(lambda: fr("ls", "--json").stdout.strip() != "[]" and fr("ls", "--json"), 60)
    iid = json.loads(ids.stdout)[0]["id"]
    poll(lambda: row(db, iid)["status"] == "completed", 60, what="good file completed")
    text, data = _explain(fr, iid)
    assert "created by a rule on event #" in text and "csv_ingest.inbox" in text
    assert "moved to 'summarise'" in text and "moved to 'archive'" in text
    assert "completed: 'done' is a terminal state" in text
    assert "nothing: completed in terminal state 'done'" in text
    kinds = [e["kind"] for e in data["timeline"]]
    assert kinds[0] == "created" and kinds.count("attempt") == 4  # 3 moves + "completed"
    assert [e["kind"] for e in data["forecast"]] == ["due"]


def test_errors_back_off_then_spend_the_budget(example) -> None:
    fr, _ = example
    db = engine_at(fr.home)
    iid = _start(fr, "path=inbox/missing.csv")
    poll(lambda: row(db, iid)["status"] == "sleeping", 60, what="first backoff")
    res = fr("explain", str(iid), "--json")  # one snapshot (the delays are jittered)
    data = json.loads(res.stdout)
    if data["instance"]["status"] == "sleeping":
        n = sum(e["kind"] == "attempt" for e in data["timeline"])  # errors so far: 1 or 2
        due = data["forecast"][0]
        # the jittered delay may already be over when explain reads it (a delay drawn near 0)
        assert due["kind"] == "due"
        assert due["text"].startswith(("sleeping until", "due now")), due["text"]
        high = {1: "5s", 2: "10s"}[n]
        assert f"backoff {n}: {high}, full jitter: a delay drawn from 0ms to {high}" in due["text"]
        nxt = data["forecast"][1]
        assert nxt["kind"] == "next_error" and nxt["data"]["n"] == n + 1
        if n == 1:
            assert nxt["data"]["high"] == 10 and "backoff 2: 10s" in nxt["text"]
        else:
            assert "the budget would be spent, so the instance becomes failed" in nxt["text"]
        stuck = data["forecast"][2]
        assert stuck["kind"] == "next_restart" and "restart 1 of 3" in stuck["text"]

    poll(lambda: row(db, iid)["status"] == "failed", 90, what="budget spent")
    text, data = _explain(fr, iid)
    waits = [e for e in data["timeline"] if e["kind"] == "wait" and e["data"]["cause"]]
    backoffs = [w["data"]["cause"] for w in waits if w["data"]["cause"]["kind"] == "backoff"]
    assert [(b["n"], b["low"], b["high"]) for b in backoffs] == [(1, 0.0, 5.0), (2, 0.0, 10.0)]
    for w in waits:
        cause = w["data"]["cause"]
        if cause["kind"] == "backoff":  # never early; a late start is explained, not hidden
            assert w["data"]["waited"] >= cause["low"]
            late = w["data"]["waited"] > cause["high"] + 1.0
            assert late == ("for a free worker (none was idle)" in w["text"]), w["text"]
    errors = [e for e in data["timeline"] if e["kind"] == "attempt"]
    assert len(errors) == 3
    assert all("cannot read inbox/missing.csv" in e["text"] for e in errors)
    assert "error 3 of 3 in 1h: the error budget is spent; the instance becomes failed" in text
    assert f"`flowrun retry {iid}`" in text
    assert "after a retry, the next error would be error 1 of 3" in text


def test_quarantine_waits_for_an_event_and_commands_show(example) -> None:
    fr, _ = example
    db = engine_at(fr.home)
    bad = fr.flows / "short.csv"
    bad.write_text("a,b\n1,2\n")
    iid = _start(fr, f"path={bad}", "min_rows=5")
    poll(lambda: row(db, iid)["state"] == "quarantine", 60, what="quarantined")
    text, data = _explain(fr, iid)
    assert "moved to 'quarantine'" in text
    assert f"`flowrun send {iid} release` (→ validate)" in text
    assert f"`flowrun send {iid} discard` (→ done)" in text
    res = fr("send", str(iid), "discard")
    assert res.returncode == 0, res.stderr
    text, data = _explain(fr, iid)
    commands = [e for e in data["timeline"] if e["kind"] == "command"]
    assert commands and commands[-1]["data"]["command"] == "send"
    assert "send by cli: instance" in text and "--discard--> done" in text


def test_unknown_instance_is_one_line(example) -> None:
    fr, _ = example
    res = fr("explain", "999999")
    assert res.returncode == 1
    assert res.stderr.strip() == "flowrun: no instance 999999"
