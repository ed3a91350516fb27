"""Who uses the 2 cores while one flowrun daemon drains no-op jobs on PostgreSQL (not a test).

N no-op instances (a ``call`` state, then a terminal one) are queued in a fresh database;
one ``flowrun --daemon --exit-when-idle --concurrency C`` drains them while this process
samples, every 50 ms: the daemon's threads (``/proc/<pid>/task/*/stat``), its PostgreSQL
backends (``/proc/<pid>/schedstat``: the server must run on this machine) and the whole
machine (``/proc/stat``). Over the steady part of the run (from 10% to 90% of the
backends' final CPU) it prints, in cores: the daemon, its backends, the rest (everything
else: this process, other work on the machine), the machine's busy and idle share, and
the jobs/s (first attempt start to last attempt end). Issue 14: is a core idle while the
cycle is serial?

    python bench/pg_cpu_share.py [--n 50000] [--concurrency 256] [--repeat 2]
        [--server postgresql://postgres@127.0.0.1:5432/test] [--compare OLD_TREE]

``--compare OLD_TREE`` (another checkout, e.g. ``git archive main`` extracted) runs its
daemon in turn with this one's (the instances are queued by this checkout's code).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pg_cycles import FLOW, _backend_ns, fresh_db  # a sibling: the same database and flow

ROOT = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")


def _ticks(path: str) -> float:
    """CPU seconds (user + system) of the process or thread whose ``stat`` is ``path``."""
    with open(path) as f:
        text = f.read()
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def _machine() -> tuple[float, float]:
    """``(all, idle)`` CPU seconds of the machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return sum(cpu[:8]) / HZ, (cpu[3] + cpu[4]) / HZ


def run(server: str, n: int, concurrency: int, tree: Path | None) -> dict:
    """One daemon of ``tree`` (default: this checkout) draining ``n`` no-op instances;
    returns the cores each part used over the steady part, and the jobs/s."""
    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    with fresh_db(server) as (name, url), tempfile.TemporaryDirectory() as tmp:
        flows = Path(tmp)
        (flows / "job.yaml").write_text(FLOW % "job_tasks:noop")
        (flows / "job_tasks.py").write_text("async def noop(ctx):\n    return True\n")
        engine = make_engine(url)
        with engine.begin() as conn:
            create_instances(conn, load_flow(flows / "job.yaml"), [{"i": i} for i in range(n)])
        engine.dispose()  # its backend is not the daemon's: gone before the daemon starts
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
        env["PYTHONPATH"] = str(tree or ROOT)
        argv = [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", url]
        argv += ["--daemon", "--exit-when-idle", "--concurrency", str(concurrency)]
        with open(flows / "daemon.log", "w+") as log:
            proc = subprocess.Popen(argv, env=env, cwd=str(tree or ROOT), stderr=log)
            samples = _sample(proc, server, name, log)
        with engine.connect() as conn:
            first, last, done = conn.exec_driver_sql(
                "SELECT min(started_at), max(finished_at), count(*) FROM attempts"
                " WHERE outcome = 'moved'"
            ).one()
        engine.dispose()
    return {**_steady(samples), "rate": round(done / (last - first))}


def _sample(proc: subprocess.Popen, server: str, name: str, log) -> list[tuple]:
    """Sample until ``proc`` exits: ``(wall, machine, daemon cpu, backends cpu)`` rows;
    ``log`` (its stderr, a file) is shown if it fails."""
    import psycopg

    threads: dict[str, float] = {}
    backends: dict[int, float] = {}
    samples = []
    with psycopg.connect(server, autocommit=True) as watch:
        while proc.poll() is None:
            try:
                for tid in os.listdir(f"/proc/{proc.pid}/task"):
                    threads[tid] = _ticks(f"/proc/{proc.pid}/task/{tid}/stat")
            except OSError:
                pass
            query = "SELECT pid FROM pg_stat_activity WHERE datname = %s"
            for (pid,) in watch.execute(query, (name,)).fetchall():
                try:
                    backends[pid] = _backend_ns(pid) / 1e9
                except OSError:
                    pass
            samples.append((time.time(), _machine(), sum(threads.values()), sum(backends.values())))
            time.sleep(0.05)
    if proc.returncode:
        log.seek(0)
        raise SystemExit(f"the daemon failed ({proc.returncode}): {log.read()[-2000:]}")
    return samples


def _steady(samples: list[tuple]) -> dict:
    """Cores used between 10% and 90% of the backends' final CPU."""
    final = samples[-1][3]
    steady = [s for s in samples if 0.1 * final <= s[3] <= 0.9 * final]
    if len(steady) < 2:
        return {"steady_s": 0.0}
    a, b = steady[0], steady[-1]
    dt = b[0] - a[0]
    busy = (b[1][0] - a[1][0]) - (b[1][1] - a[1][1])
    out = {
        "steady_s": round(dt, 2),
        "daemon": (b[2] - a[2]) / dt,
        "backends": (b[3] - a[3]) / dt,
        "busy": busy / dt,
        "idle": (b[1][1] - a[1][1]) / dt,
    }
    out["rest"] = out["busy"] - out["daemon"] - out["backends"]
    return {k: round(v, 2) for k, v in out.items()}


def main() -> None:
    """Parse the options; run the repeats interleaved; print one line per run."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--compare", type=Path, default=None, help="another checkout (A/B)")
    args = p.parse_args()
    sides = {"new": None, **({"old": args.compare} if args.compare else {})}
    print(f"load {os.getloadavg()[0]:.1f}; {args.n} no-op jobs; cores over the steady part")
    for r in range(args.repeat):
        for side, tree in sides.items() if r % 2 == 0 else reversed(sides.items()):
            out = run(args.server, args.n, args.concurrency, tree)
            print(f"{side} run {r + 1}: {json.dumps(out)}", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
