"""Hostile input through real processes (issue 18): ``flowrun check`` answers each hostile
flow file with one positioned line (exit 2, bounded memory), and a running daemon whose
flows folder receives them keeps its last good versions and keeps working."""

from __future__ import annotations

import resource
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.fault import Flowrun, flowrun_cmd, poll, unique, write_flow
from tests.support.hostile import CASES, Hostile

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
