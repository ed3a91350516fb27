"""Sensor latency benchmark: file written -> handler started, through a real daemon.

Starts ``flowrun --daemon`` on a temporary flows folder with a no-op flow whose ``files``
sensor watches ``inbox/`` and whose rule starts one instance per file. Files are dropped
the usual atomic way (written as ``.name.tmp``, renamed into place) so the sensor counts
them at once instead of waiting ``settle``. The handler records ``time.time()`` when it
starts; latency = handler start - rename time.

1. ``N`` files, one every 10 ms: prints p50 / p99 / max latency.
2. A burst of ``B`` files dropped at once: prints the time until every handler has run.

Usage: ``.venv/bin/python bench/latency.py [--quick] [--n N] [--burst B]``
(``--quick``: N=200, B=1000). Goal: p50 <= 20 ms, p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOW = """\
flow: bench
initial: run
states:
  run:
    call: bench_handler:run
    to: [done]
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.dat"}}
rules:
  - when: inbox
    start: bench
    data: {path: "{event.path}", name: "{event.name}"}
"""

HANDLER = """\
import os
import time

OUT = os.path.join(os.path.dirname(__file__), "started.log")


def run(ctx):
    now = time.time()
    with open(OUT, "a") as f:
        f.write(f"{ctx.data['name']} {now!r}\\n")
    return "done"
"""


def started(out: Path) -> dict[str, float]:
    if not out.exists():
        return {}
    times = {}
    for line in out.read_text().splitlines():
        name, _, at = line.partition(" ")
        if at:
            times[name] = float(at)
    return times


def drop(inbox: Path, name: str) -> float:
    tmp = inbox / f".{name}.tmp"
    tmp.write_bytes(b"x" * 64)
    os.rename(tmp, inbox / name)
    return time.time()


def wait_for(out: Path, names: set[str], timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        got = started(out)
        if names <= set(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def breakdown(db: Path, written: dict[str, float]) -> dict[str, list[float]]:
    """Per-stage latencies (ms) from the database: written -> event stored -> rule acted
    (instance created) -> attempt started."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT e.payload, e.created_at, e.handled_at, min(a.started_at) FROM events e "
            "JOIN instances i ON i.event_id = e.id JOIN attempts a ON a.instance_id = i.id "
            "GROUP BY e.id"
        ).fetchall()
    finally:
        con.close()
    stages: dict[str, list[float]] = {
        "written -> event stored": [],
        "event stored -> rule acted": [],
        "rule acted -> attempt claimed": [],
    }
    for payload, created, handled, claimed in rows:
        name = json.loads(payload)["name"]
        if name in written and handled and claimed:
            stages["written -> event stored"].append((created - written[name]) * 1000)
            stages["event stored -> rule acted"].append((handled - created) * 1000)
            stages["rule acted -> attempt claimed"].append((claimed - handled) * 1000)
    return {k: v for k, v in stages.items() if v}


def stop(daemon: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a daemon gracefully (SIGINT); kill it if it has not exited in ``timeout`` s."""
    daemon.send_signal(signal.SIGINT)
    try:
        daemon.wait(timeout)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N=200, burst=1000")
    ap.add_argument("--n", type=int, default=None, help="files at 10 ms intervals (1000)")
    ap.add_argument("--burst", type=int, default=None, help="files dropped at once (10000)")
    ap.add_argument("--interval", type=float, default=0.010, help="seconds between files")
    ap.add_argument("--concurrency", type=int, default=32)
    args = ap.parse_args()
    n = args.n or (200 if args.quick else 1000)
    burst = args.burst or (1000 if args.quick else 10000)

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="flowrun-bench-") as tmpdir:
        tmp = Path(tmpdir)
        flows = tmp / "flows"
        inbox = flows / "inbox"
        inbox.mkdir(parents=True)
        (flows / "bench.yaml").write_text(FLOW)
        (flows / "bench_handler.py").write_text(HANDLER)
        out = flows / "started.log"
        cmd = [
            sys.executable, "-m", "runner.cli", "--flows", str(flows),
            "--db", f"sqlite:///{tmp / 'bench.db'}", "--daemon",
            "--concurrency", str(args.concurrency), "--worker-id", "bench",
        ]  # fmt: skip
        log = open(tmp / "daemon.log", "w")
        daemon = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT)
        try:
            warm = {"warmup.dat"}
            drop(inbox, "warmup.dat")
            if not wait_for(out, warm, 60).keys() >= warm:
                print("daemon did not start a handler within 60 s; log:", file=sys.stderr)
                print((tmp / "daemon.log").read_text()[-3000:], file=sys.stderr)
                return 1

            written = {}
            for i in range(n):
                name = f"s{i:06d}.dat"
                written[name] = drop(inbox, name)
                time.sleep(args.interval)
            got = wait_for(out, set(written), 120)
            lat = [(got[k] - t) * 1000 for k, t in written.items() if k in got]
            stages = breakdown(tmp / "bench.db", written)
            print(f"steady: {len(lat)}/{n} files, one every {args.interval * 1000:g} ms")
            if lat:
                print(
                    f"  file written -> handler started: p50 {pct(lat, 50):.1f} ms, "
                    f"p99 {pct(lat, 99):.1f} ms, max {max(lat):.1f} ms, "
                    f"mean {statistics.mean(lat):.1f} ms"
                )
            for stage, values in stages.items():
                print(f"  {stage}: p50 {pct(values, 50):.1f} ms, p99 {pct(values, 99):.1f} ms")

            names = {f"b{i:06d}.dat" for i in range(burst)}
            t0 = time.time()
            for name in sorted(names):
                drop(inbox, name)
            t_written = time.time() - t0
            got = wait_for(out, names, 600)
            done = [got[k] for k in names if k in got]
            if done:
                print(
                    f"burst: {len(done)}/{burst} files handled; written in {t_written:.2f} s, "
                    f"all handlers started {max(done) - t0:.2f} s after the first write "
                    f"({len(done) / (max(done) - t0):.0f} files/s)"
                )
        finally:
            stop(daemon)
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
