"""Claim latency while a prune runs, against none (not a test; issue 27, item 2).

A daemon (no ``--exit-when-idle``, pruner off) runs on a database holding ``--size``
terminal instances of history (built by ``bench/scale.py``'s ``build``: events, rules,
a daemon, all flowrun's own code; or the copy of one given with ``--from``). A feeder
starts one instance of a two-state no-op flow every ``1 / --rate`` seconds, each in its
own transaction, for ``--seconds``; an instance's **claim latency** is its first
attempt's ``started_at`` minus its ``created_at`` (both written by flowrun: the insert's
time and the time its claim started the handler). Two phases on the same database and
daemon: ``none`` (nothing else runs), then ``prune`` (``flowrun prune --flow hist
--older-than 1s`` deletes the history meanwhile; the phase lasts until the prune ends).
On PostgreSQL the server's ``autovacuum`` is on for the run (``scale.autovacuum_on``):
with it off, as on the shared test server, the build's dead row versions and missing
statistics made a prune of 100,000 take 309 s instead of seconds.

    python bench/prune_claims.py [--size 100000] [--from DIR] [--rate 50]
                                 [--seconds 30] [--db sqlite|postgresql] [--pg-url URL]

Prints one JSON object: p50/p95/p99 (ms) per phase, the ratio of the p99s, and the
prune's rows and seconds. Run on a shared machine, compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import scale  # noqa: E402


def feed(url: str, flows: Path, rate: float, until) -> list[int]:
    """Start one ``noop`` instance every ``1 / rate`` s while ``until()`` is false; the
    ids of the instances made meanwhile (only the feeder makes any)."""
    from sqlalchemy import func, select

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine
    from runner.store.tables import instances

    engine = make_engine(url)
    flow = load_flow(flows / "noop.yaml")
    top = select(func.coalesce(func.max(instances.c.id), 0))
    with engine.connect() as conn:
        first = conn.execute(top).scalar_one() + 1
    step = 1.0 / rate
    tick = time.monotonic()
    while not until():
        with engine.begin() as conn:
            create_instances(conn, flow, [{}])
        tick += step
        time.sleep(max(0.0, tick - time.monotonic()))
    with engine.connect() as conn:
        last = conn.execute(top).scalar_one()
    engine.dispose()
    return list(range(first, last + 1))


def latencies(url: str, ids: list[int], deadline: float = 120.0) -> list[float]:
    """Claim latency (ms) of each of ``ids``, once every one has started."""
    from sqlalchemy import func, select

    from runner.store.db import make_engine
    from runner.store.tables import attempts, instances

    engine = make_engine(url)
    lo, hi = min(ids), max(ids)
    stmt = (
        select(instances.c.created_at, func.min(attempts.c.started_at))
        .join(attempts, attempts.c.instance_id == instances.c.id)
        .where(instances.c.id.between(lo, hi), instances.c.flow == "noop")
        .group_by(instances.c.id, instances.c.created_at)
    )
    end = time.monotonic() + deadline
    while True:
        with engine.connect() as conn:
            rows = conn.execute(stmt).all()
        if len(rows) >= len(ids) or time.monotonic() > end:
            break
        time.sleep(0.5)
    engine.dispose()
    return [(s - c) * 1000 for c, s in rows]


def summary(ms: list[float]) -> dict:
    q = statistics.quantiles(ms, n=100)
    return {
        "n": len(ms),
        "p50_ms": round(q[49], 1),
        "p95_ms": round(q[94], 1),
        "p99_ms": round(q[98], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=100_000, help="terminal instances of history")
    ap.add_argument("--from", dest="source", type=Path, help="copy this built folder instead")
    ap.add_argument("--rate", type=float, default=50.0, help="instances started per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the 'none' phase")
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flowrun-prune-claims-"))
    try:
        print(json.dumps(run(a, work), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for name in scale.MADE:
            scale._admin(a.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(a: argparse.Namespace, work: Path) -> dict:
    """Both phases; the report."""
    home = work / "big"
    if a.source is not None:
        shutil.copytree(a.source, home, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
    flows = home / "flows"
    flows.mkdir(parents=True, exist_ok=True)
    (flows / "hist.yaml").write_text(scale.HISTORY)
    (flows / "noop.yaml").write_text(scale.NOOP)
    (flows / "scale_tasks.py").write_text(scale.TASKS)
    url = f"sqlite:///{home / 'flowrun.db'}" if a.db == "sqlite" else scale.pg_database(a.pg_url)
    report: dict = {"db": a.db, "rate": a.rate}
    with scale.autovacuum_on(url) as autovacuum:
        if autovacuum is not None:
            report["autovacuum"] = autovacuum
        return _phases(a, url, flows, home, report)


def _phases(a: argparse.Namespace, url: str, flows: Path, home: Path, report: dict) -> dict:
    """The build (unless ``--from``), then both phases on one daemon; fills ``report``."""
    if a.source is None:
        report["build"] = scale.build(url, flows, a.size, 64)
    report["rows"] = scale.counts(url)
    env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    argv = [sys.executable, "-m", "runner.cli", "--daemon", "--prune-every", "0"]
    daemon = subprocess.Popen(argv, env=env, cwd=home, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # its first claims and sensors
        end = time.monotonic() + a.seconds
        none = feed(url, flows, a.rate, lambda: time.monotonic() > end)
        report["none"] = summary(latencies(url, none))
        prune = [sys.executable, "-m", "runner.cli", "prune", "--flow", "hist"]
        prune += ["--older-than", "1s", "--json"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(prune, env=env, cwd=home, stdout=subprocess.PIPE, text=True)
        during = feed(url, flows, a.rate, lambda: proc.poll() is not None)
        report["prune"] = summary(latencies(url, during))
        report["prune"]["s"] = round(time.perf_counter() - t0, 1)
        out = json.loads(proc.stdout.read())
        report["prune"]["rows"] = {k: out[k] for k in ("instances", "attempts")}
    finally:
        daemon.send_signal(signal.SIGINT)
        daemon.wait(60)
    report["p99_prune_vs_none"] = round(report["prune"]["p99_ms"] / report["none"]["p99_ms"], 2)
    return report


if __name__ == "__main__":
    main()
