"""Hostile input through real processes: ``flowrun check`` answers each hostile
flow file with one positioned line (exit 2, bounded memory), and a running daemon whose
flows folder receives them keeps its last good versions and keeps working."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from runner.store.limit_names import limit_name
from tests.support.fault import Flowrun, daemon_running, flowrun_cmd, poll, unique, write_flow
from tests.support.hostile import (
    CASES,
    INVALID_UTF8,
    INVALID_UTF8_SHOWN,
    TEXTS,
    Hostile,
    HostileText,
    missing,
    raw_controls,
)

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_check_subprocess_one_line(tmp_path: Path, case: Hostile) -> None:
    path = tmp_path / f"{case.name}.yaml"
    path.write_bytes(case.data)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run(
        [*flowrun_cmd(), "check", str(path)], capture_output=True, text=True, timeout=120
    )
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{path}:{case.line}:{case.col}: ") and case.says in lines[0]
    # the largest child so far: at most this one and earlier (small) ones
    assert peak_kib < 200 * 1024 or before >= 200 * 1024, peak_kib


FLOW = """\
initial: work
states:
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""
# the same flow, started by the daemon itself for each file dropped into inbox/
WATCHED = (
    FLOW
    + """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt", settle: 50ms}}
rules:
  - {when: inbox, start: NAME}
"""
)


def test_daemon_keeps_last_good_versions(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    name, victim = unique("good"), unique("victim")
    write_flow(fr.flows, name, FLOW)
    watched = write_flow(fr.flows, victim, WATCHED.replace("NAME", victim))
    (fr.flows / "inbox").mkdir()
    daemon = fr.daemon(worker_id=unique("hostile"))

    def completed(flow: str, count: int) -> bool:
        res = fr("ls", "--json", "--flow", flow, "--status", "completed")
        return res.returncode == 0 and res.stdout.count('"id"') == count

    try:
        poll(lambda: "started" in daemon.log(), 60, what="daemon start")
        for case in CASES:
            (fr.flows / f"{case.name}.yaml").write_bytes(case.data)
            poll(
                lambda c=case: f"{c.name}.yaml:{c.line}:{c.col}: " in daemon.log(),
                60,
                what=f"{case.name} rejected",
            )
        # the watched flow's own file overwritten with a bomb: its last good version
        # (sensor and rule included) stays in force
        watched.write_bytes(CASES[0].data)
        poll(lambda: f"{watched}:{CASES[0].line}:" in daemon.log(), 60, what="bomb rejected")
        (fr.flows / "inbox" / "one.txt").write_text("1")
        poll(lambda: completed(victim, 1), 120, every=0.5, what="watched flow ran")
        # and the daemon takes new work from the CLI
        res = fr("start", name)
        assert res.returncode == 0, res.stderr
        poll(lambda: completed(name, 1), 120, every=0.5, what="good flow ran")
        assert "Traceback" not in daemon.log()
        daemon.signal(signal.SIGINT)
        assert daemon.wait(60) == 0, daemon.log()
    finally:
        daemon.stop()
        print(daemon.log())  # shown by pytest when the test fails


def test_start_with_data_the_cli_cannot_take(tmp_path: Path) -> None:
    """Too deep, not strict JSON, not an object: one line, exit 2, nothing created."""
    fr = Flowrun(tmp_path)
    name = unique("good")
    write_flow(fr.flows, name, FLOW)
    deep = "[" * 10_000 + "]" * 10_000
    for args in (
        ("--data", '{"v": ' + deep + "}"),
        (f"v={deep}",),
        ("--data", '{"v": NaN}'),
        ("--data", "[1, 2]"),
        ("--data", "{not json"),
    ):
        res = fr("start", name, *args)
        assert res.returncode == 2, (args[0][:20], res)
        assert "Traceback" not in res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("flowrun: "), res.stderr
    if (tmp_path / "flowrun.db").exists():  # data is checked before the database opens
        res = fr("ls", "--json")
        assert res.returncode == 0 and res.stdout.strip() == "[]", res


# --- hostile text through every command's text and --json output --------------------

HOSTILE_FLOW = """\
description: "[bold red]disk[/] [payments] \\\\[x] flow"
label: "{data.label}"
max_running: {limit: 1, key: "{data.label}"}
initial: work
defaults:
  try_interval: 100ms
  error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}
states:
  work:
    exec: [python, -m, hostile_fail]
    next: done
  done: {terminal: true}
"""
# writes the instance's data.err (and INVALID_UTF8) to stderr and fails
HOSTILE_FAIL = """\
import json, os, sys
data = os.environ.get("FLOWRUN_DATA") or open(os.environ["FLOWRUN_DATA_FILE"]).read()
data = json.loads(data)
sys.stderr.buffer.write(RAW + b"\\n" + data["err"].encode("utf-8", "surrogateescape") + b"\\n")
sys.exit(1)
"""
# a quarantine-like external state, fed by a tail sensor and a files sensor
HOLD_FLOW = """\
label: "{data.label}"
initial: quarantine
states:
  quarantine:
    external: true
    on: {release: done, discard: done}
  done: {terminal: true}
sensors:
  log: {tail: {path: app.log, from: start}}
  inbox: {files: {path: inbox, glob: "*", settle: 50ms}}
rules:
  - {when: log, start: NAME, data: {label: "{event.line}"}}
  - {when: inbox, start: NAME, data: {label: "{event.name}"}}
"""


def _strings(value):
    """Every string in a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _check_text(out: str, cases, what: str) -> None:
    """``out`` carries no raw control and shows every case's fragments verbatim."""
    assert not raw_controls(out), (what, raw_controls(out)[:5])
    for case in cases:
        assert not missing(out, case), (what, case.name, missing(out, case))


# ~150 `flowrun` processes one after the other: minutes on a loaded 2-core machine
@pytest.mark.timeout(1800)
def test_every_command_shows_hostile_text_literally(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    fr.env["COLUMNS"] = "250"
    hostile, hold = unique("hostile"), unique("hold")
    write_flow(
        fr.flows,
        hostile,
        HOSTILE_FLOW,
        {"hostile_fail": f"RAW = {INVALID_UTF8!r}\n" + HOSTILE_FAIL},
    )
    write_flow(fr.flows, hold, HOLD_FLOW.replace("NAME", hold))
    (fr.flows / "inbox").mkdir()
    lines = [t for t in TEXTS if "\n" not in t.text and "\r" not in t.text and "\x00" not in t.text]
    (fr.flows / "app.log").write_bytes(
        b"".join(t.text.encode() + b"\n" for t in lines) + INVALID_UTF8 + b"\n"
    )
    names = [t for t in TEXTS if "/" not in t.text and "\x00" not in t.text and len(t.text) < 200]
    for t in names:
        (fr.flows / "inbox").joinpath(
            t.text.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
        ).write_text("x")
    ids = {}
    for t in TEXTS:
        # one argument holds at most 128 KiB: the long line only once
        data = json.dumps({"label": t.text[:1000], "err": t.text, "value": t.text[:1000]})
        res = fr("start", hostile, "--data", data)
        assert res.returncode == 0, res.stderr
        ids[t.name] = int(res.stdout)
    wid = "w[bold]x[/]\x1b[2J"
    with daemon_running(fr, "hostile", "--worker-id", wid):
        want = len(TEXTS) + len(lines) + 1 + len(names)

        def settled() -> bool:
            rows = json.loads(fr("ls", "--json").stdout)
            failed = sum(r["status"] == "failed" for r in rows)
            return len(rows) == want and failed == len(TEXTS)

        poll(settled, 120, every=0.5, what="every instance failed or parked")
    rows = json.loads(fr("ls", "--json").stdout)
    by_id = {r["id"]: r for r in rows}
    for t in TEXTS:  # --json keeps the exact stored text
        assert by_id[ids[t.name]]["data"]["err"] == t.text
        assert t.text[-1000:] in by_id[ids[t.name]]["last_error"]  # its stderr's tail

    def text(*args: str, code: int = 0) -> str:
        res = fr(*args)
        assert res.returncode == code and "Traceback" not in res.stderr, (args, res)
        out = res.stdout + res.stderr
        assert not raw_controls(out), (args, raw_controls(out)[:5])
        return out

    def json_of(*args: str):
        res = fr(*args)
        assert res.returncode == 0, (args, res)
        return json.loads(res.stdout)

    for columns in ("250", "80"):
        fr.env["COLUMNS"] = columns
        out = text("ls")
        assert "[payments]" in out and "[bold red]disk[/]" in out, out
        text("ls", "--search", "[")
    fr.env["COLUMNS"] = "250"
    for t in TEXTS:
        iid = str(ids[t.name])
        _check_text(text("show", iid), [t], f"show {t.name}")
        # explain gives an error's last line: the case's last fragment
        last = HostileText(t.name, t.text, t.shown[-1:])
        _check_text(text("explain", iid), [last], f"explain {t.name}")
        shown = json_of("show", iid, "--json")
        assert shown["data"]["err"] == t.text and t.text[-1000:] in shown["history"][-1]["error"]
        told = list(_strings(json_of("explain", iid, "--json")))
        assert all(any(f in x for x in told) for f in t.shown), (t.name, told)
        text("send", iid, t.text[:200].replace("\x00", ""), code=2)
        # the attempt's output: RAW, then the case's text, on stderr
        out = text("logs", iid)
        _check_text(out, [t], f"logs {t.name}")
        assert all(s in out for s in INVALID_UTF8_SHOWN), (t.name, out[:300])
        res = fr("logs", iid, "--json")
        assert res.returncode == 0 and not raw_controls(res.stdout), (t.name, res)
        chunks = [json.loads(line) for line in res.stdout.splitlines()]
        assert t.text in "".join(c["text"] for c in chunks if c["stream"] == "stderr")
    events = json_of("events", "--json", "--limit", "500")
    lines_seen = {e["payload"].get("line") for e in events}
    assert {t.text for t in lines} <= lines_seen  # the exact lines, as stored
    _check_text(text("events", "--limit", "500"), lines, "events")
    out = text("events", "--limit", "500")
    assert all(s in out for s in INVALID_UTF8_SHOWN), out
    _check_text(out, names, "events: file names")
    assert "[bold]x[/]" in text("workers") and json_of("workers", "--json")[0]["id"] == wid
    for t in lines:
        out = text("rules", "test", hold, "--sensor", "log", "--line", t.text)
        assert json.dumps(t.text)[1:40] in out, (t.name, out)  # the event, as JSON
        assert (
            json_of("rules", "test", hold, "--sensor", "log", "--line", t.text, "--json")[
                "payload"
            ]["line"]
            == t.text
        )
    bad = tmp_path / "other" / "bad\x1b[2J[bold]x.yaml"
    bad.parent.mkdir()
    bad.write_text("initial: a\nstates:\n  a: {terminal: true, on: [x]}\n")
    assert "bad\\x1b[2J[bold]x.yaml:3:" in text("check", str(bad), code=2)
    text("graph", hostile)
    text("migrate", "--flow", hostile, "--to", "latest", "--dry-run")
    assert json_of("migrate", "--flow", hostile, "--to", "latest", "--json") == []
    # pools named from hostile data: the flow's max_running key is the label
    pools = {p["name"] for p in json_of("pool", "ls", "--json")}
    assert {limit_name(hostile, "{data.label}", {"label": t.text[:1000]}) for t in TEXTS} <= pools
    out = text("pool", "ls")
    assert f"flow:{hostile}:[payments]" in out and "[bold red]disk[/] full" in out, out
    fr.env["COLUMNS"] = "80"
    text("pool", "ls")
    fr.env["COLUMNS"] = "250"
    # the commands' answers on an instance whose label, data and error are hostile
    iid = str(ids["markup"])
    for args in (
        ("retry", iid),
        ("pause", iid),
        ("resume", iid),
        ("sleep", iid, "--for", "1h"),
        ("wake", iid),
        ("kill", iid),
    ):
        assert iid in text(*args), args
    text("retry", iid, code=1)  # refused: killed
    _check_text(text("show", iid), [TEXTS[[t.name for t in TEXTS].index("markup")]], "show")
    assert json_of("prune", "--json", "--dry-run")["dry_run"] is True


def test_arguments_that_are_not_utf8_get_one_line(tmp_path: Path) -> None:
    """An argument with bytes that are not UTF-8 (a flow name, a search, an event):
    one line naming the byte, exit 2, never a traceback; nothing is written."""
    fr = Flowrun(tmp_path)
    name = unique("good")
    write_flow(fr.flows, name, FLOW)
    iid = fr("start", name).stdout.strip()
    assert iid.isdigit()
    for args in (
        ("ls", "--flow", b"\xff"),
        ("ls", "--search", INVALID_UTF8),
        ("pause", "--flow", b"\xff"),
        ("send", iid, b"\xff\x1b[2J"),
        ("start", b"caf\xe9"),
    ):
        res = subprocess.run(fr.argv(*args), env=fr.env, capture_output=True, timeout=60)
        err = res.stderr.decode()
        assert res.returncode == 2 and "Traceback" not in err, (args, err)
        assert err.startswith("flowrun: an argument is not UTF-8 text (byte 0x"), err
        assert len(err.strip().splitlines()) == 1 and not raw_controls(err), err
    rows = json.loads(fr("ls", "--json").stdout)
    assert [(r["id"], r["status"]) for r in rows] == [(int(iid), "runnable")]
