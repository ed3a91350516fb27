"""The CPU an idle daemon burns (not a test): a real ``flowrun --daemon`` with 8 flows.

The flows: one with a ``files`` sensor on an empty folder, one with a ``tail`` sensor on
a log file nothing appends to, one with an ``every: 1h`` clock sensor, five with no
sensor; nothing is due. Once the daemon says its sensors are ready and it has settled
(``--settle`` s), its own CPU counters (``/proc/PID/stat`` fields 14 and 15, ``utime`` +
``stime``, in clock ticks) are read at the start and the end of a ``--seconds`` window;
the figure is their difference over the window, in percent of one core. The daemon is
then stopped (SIGTERM).

To compare two trees, run it from outside both (the daemon is ``python -m runner.cli``
in the current folder) with ``PYTHONPATH`` set to the root of the tree to measure.

Usage::

    .venv/bin/python bench/daemon_idle.py [--seconds 60] [--settle 5] [--db URL]
                                          [-- extra flowrun options]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOWS = {
    "inbox": 'sensors:\n  inbox: {files: {path: inbox, glob: "*.csv"}}\n'
    "rules:\n  - when: inbox\n    start: inbox\n",
    "errors": "sensors:\n  errors: {tail: {path: app.log, match: ERROR}}\n"
    "rules:\n  - when: errors\n    start: errors\n",
    "hourly": "sensors:\n  hourly: {every: 1h}\nrules:\n  - when: hourly\n    start: hourly\n",
}
#: ``--lifecycle``: one more flow whose failures alert (a ``lifecycle`` sensor, an ``exec`` rule)
LIFECYCLE = (
    "sensors:\n  trouble: {lifecycle: {}}\nrules:\n  - when: trouble\n    exec: [sh, -c, 'cat']\n"
)
STATES = (
    "initial: work\n"
    'states: {work: {exec: [sh, -c, "exit 0"], next: done}, done: {terminal: true}}\n'
)


#: ``--deadline``: one more flow with a deadline (its daemon's deadline watch looks for
#: the earliest one every 0.5 s)
DEADLINE = "deadline: {after: 1d, then: alert}\n"


def write_flows(folder: Path, lifecycle: bool = False, deadline: bool = False) -> None:
    """The 8 flows of the bench in ``folder`` (its inbox folder and log file too), with
    ``lifecycle`` one more that alerts on failures, with ``deadline`` one with a
    deadline."""
    (folder / "inbox").mkdir(parents=True)
    (folder / "app.log").write_text("")
    names = list(FLOWS) + [f"plain{i}" for i in range(5)]
    for name in names:
        (folder / f"{name}.yaml").write_text(f"flow: {name}\n{FLOWS.get(name, '')}{STATES}")
    if lifecycle:
        (folder / "alerting.yaml").write_text(f"flow: alerting\n{LIFECYCLE}{STATES}")
    if deadline:
        (folder / "late.yaml").write_text(f"flow: late\n{DEADLINE}{STATES}")


def cpu_ticks(pid: int) -> int:
    """``utime + stime`` of ``pid`` in clock ticks (``/proc/PID/stat`` fields 14, 15)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def wait_ready(log: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait until the daemon's log says its sensors are ready."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"daemon exited {proc.returncode}:\n{log.read_text()}")
        if "sensors ready" in log.read_text():
            return
        time.sleep(0.2)
    sys.exit(f"daemon not ready within {timeout:g}s:\n{log.read_text()}")


def measure(
    seconds: float,
    settle: float,
    db: str | None,
    extra: list[str],
    lifecycle: bool = False,
    deadline: bool = False,
) -> float:
    """Run the daemon and return its idle CPU in percent of one core."""
    root = Path(tempfile.mkdtemp(prefix="daemon-idle-"))
    flows = root / "flows"
    write_flows(flows, lifecycle, deadline)
    url = db or f"sqlite:///{root / 'flowrun.db'}"
    log = root / "daemon.log"
    argv = [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", url]
    with log.open("w") as out:
        proc = subprocess.Popen([*argv, "--daemon", *extra], stdout=out, stderr=out)
    try:
        wait_ready(log, proc)
        time.sleep(settle)
        hz = os.sysconf("SC_CLK_TCK")
        before, t0 = cpu_ticks(proc.pid), time.monotonic()
        time.sleep(seconds)
        after, t1 = cpu_ticks(proc.pid), time.monotonic()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    used = (after - before) / hz
    print(f"{after - before} ticks ({used:.2f} s CPU) in {t1 - t0:.1f} s")
    return 100.0 * used / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window, seconds")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds idle before it")
    ap.add_argument("--db", help="database URL (default: a fresh SQLite file)")
    ap.add_argument("--lifecycle", action="store_true", help="a ninth flow with a lifecycle sensor")
    ap.add_argument("--deadline", action="store_true", help="one more flow with a deadline")
    ap.add_argument("extra", nargs="*", help="more flowrun options (after --)")
    args = ap.parse_args()
    share = measure(args.seconds, args.settle, args.db, args.extra, args.lifecycle, args.deadline)
    print(f"idle daemon: {share:.2f}% of a core")


if __name__ == "__main__":
    main()
