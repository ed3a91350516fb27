"""Soak: a daemon under steady load with a short retention stays flat (not a test, not CI).

One ``flowrun --daemon --retention 1m --event-retention 1m --prune-every 15`` on a
SQLite file (or ``--db URL``), a clock sensor ticking every 20 ms whose rule starts one
instance a tick (50 instances/s) of a three-state flow: an ``exec`` state writing a line
(``/bin/echo``), a ``call`` state checkpointing a little data, then ``done``. Every
``--every`` seconds it samples the database size (SQLite: file + WAL; PostgreSQL:
``pg_database_size``), the daemon's RSS and open descriptors and the rows per table; at
the end it stops the daemon (SIGINT), checks that nothing was lost (every event handled;
every instance an event started is either still stored or counted as pruned, and as many
as the events), and prints one JSON object: the samples, the first and last quarter's
means and their ratios.

    python bench/soak.py [--minutes 30] [--every 30] [--db URL] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

FLOW = """\
flow: soak
initial: say
retention: {completed: 1m, failed: 1m, killed: 1m}
states:
  say: {exec: [/bin/echo, "instance {data.n}"], next: keep}
  keep: {call: "soak_tasks:keep", next: done}
  done: {terminal: true}
sensors:
  tick: {every: 20ms}
rules:
  - when: tick
    start: soak
    data: {n: "{event.tick}"}
"""

TASKS = """\
def keep(ctx):
    ctx.checkpoint({"seen": ctx.data.get("n")})
    return True
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def db_bytes(home: Path, engine, url: str | None) -> int:
    """The database's size: the SQLite file and its WAL, or PostgreSQL's
    ``pg_database_size`` (tables, indexes and their dead rows until vacuumed)."""
    if url is None:
        return sum(p.stat().st_size for p in home.glob("flowrun.db*"))
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()


def rows(engine) -> dict:
    from sqlalchemy import text

    with engine.connect() as conn:
        out = {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("instances", "attempts", "events", "commands")
        }
        out["live"] = conn.execute(
            text("SELECT count(*) FROM instances WHERE status IN ('runnable','sleeping')")
        ).scalar_one()
        out["pending_events"] = conn.execute(
            text("SELECT count(*) FROM events WHERE handled_at IS NULL")
        ).scalar_one()
    return out


def quarter_means(samples: list[dict], key: str) -> tuple[float, float]:
    n = max(1, len(samples) // 4)
    first = statistics.mean(s[key] for s in samples[:n])
    last = statistics.mean(s[key] for s in samples[-n:])
    return first, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--db", help="database URL (default: a SQLite file in the work folder)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    a = ap.parse_args()
    from runner.store.db import make_engine
    from tests.support.metrics import scrape

    home = a.keep or Path(tempfile.mkdtemp(prefix="flowrun-soak-"))
    flows = home / "flows"
    flows.mkdir(parents=True, exist_ok=True)
    (flows / "soak.yaml").write_text(FLOW)
    (flows / "soak_tasks.py").write_text(TASKS)
    url = a.db or f"sqlite:///{home / 'flowrun.db'}"
    engine = make_engine(url)
    log = home / "daemon.log"
    env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    argv = [sys.executable, "-m", "runner.cli", "--daemon", "--retention", "1m"]
    argv += ["--event-retention", "1m", "--prune-every", "15", "--metrics", "127.0.0.1:0"]
    argv += ["--concurrency", "32"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=home, stdout=out, stderr=out)
    metrics = None
    for _ in range(600):
        m = re.search(r"metrics on (http://\S+)", log.read_text(errors="replace"))
        if m:
            metrics = m.group(1)
            break
        time.sleep(0.1)
    samples: list[dict] = []
    t0 = time.monotonic()
    end = t0 + a.minutes * 60
    try:
        while time.monotonic() < end and proc.poll() is None:
            time.sleep(a.every)
            sample = {
                "t": round(time.monotonic() - t0),
                "db_bytes": db_bytes(home, engine, a.db),
                "rss_kib": rss_kib(proc.pid),
                "fds": fds(proc.pid),
                **rows(engine),
            }
            samples.append(sample)
            print(json.dumps(sample), file=sys.stderr, flush=True)
        final = scrape(metrics) if metrics else {}
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    left = rows(engine)
    # what the pruner deleted: its log line per round (exact, stop included)
    pruned = {"instances": 0, "attempts": 0, "events": 0}
    for line in log.read_text(errors="replace").splitlines():
        if "flowrun.pruner" in line and "pruned " in line:
            for k in pruned:
                found = re.search(rf"(\d+) {k}\b", line)
                pruned[k] += int(found.group(1)) if found else 0
    from_metrics = {
        k: int(final.get(("flowrun_pruned_rows_total", (("kind", k),)), 0)) for k in pruned
    }
    started = left["instances"] + pruned["instances"]
    ticks = left["events"] + pruned["events"]
    report: dict = {
        "minutes": a.minutes,
        "exit": code,
        "samples": samples,
        "after_stop": left,
        "pruned": pruned,
        "pruned_by_metrics_before_stop": from_metrics,
        "nothing_lost": {
            "events_all_handled": left["pending_events"] == 0,
            "instances_started": started,
            "events_stored": ticks,
            "equal": started == ticks,
        },
    }
    if len(samples) >= 4:
        for key in ("rss_kib", "fds", "instances", "attempts", "events", "db_bytes"):
            first, last = quarter_means(samples, key)
            report[f"{key}_first_last_quarter"] = [round(first), round(last)]
    print(json.dumps(report, indent=2))
    engine.dispose()


if __name__ == "__main__":
    main()
