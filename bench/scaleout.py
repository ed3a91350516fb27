"""Scale-out: transitions/s of 1, 2 and 4 daemons sharing one PostgreSQL database.

Each run seeds ``--n`` instances of a 3-state flow (two ``call`` states, then a terminal
state) in a fresh database, starts K ``flowrun --daemon --exit-when-idle --concurrency 8``
processes and waits for them. A *transition* is one committed attempt that moved an
instance (2 per instance). The rate is transitions / (last attempt finished - first
attempt started), read back from the attempts table, so process start-up is not counted;
the wall time of the whole run is printed too.

Cases: ``io`` — ``async def`` handlers that ``await asyncio.sleep(0.02)`` (I/O-bound: the
ceiling is K x 8 slots / 20 ms = K x 400/s); ``noop`` — handlers that return at once
(bound by the database and the workers' CPU).

    python bench/scaleout.py [--n 2000] [--daemons 1,2,4] [--case io|noop|both]
        [--server postgresql+psycopg://postgres@127.0.0.1:5432/test]

The server URL is an admin connection used to create and drop ``flowrun_bench_<random>``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

FLOW = """\
flow: scale
description: 3 states, %(case)s call handlers
initial: s1
defaults:
  try_interval: 1s
  backoff: {initial: 0s, factor: 1, max: 0s, jitter: none}
states:
  s1: {call: "scale_tasks:%(case)s", next: s2}
  s2: {call: "scale_tasks:%(case)s", next: done}
  done: {terminal: true}
"""

TASKS = '''\
"""Handlers for bench/scaleout.py."""

import asyncio


async def io(ctx):
    await asyncio.sleep(0.02)
    return True


async def noop(ctx):
    return True
'''


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def run(server: str, case: str, daemons: int, n: int, workdir: Path) -> dict:
    """Drain ``n`` instances with ``daemons`` processes on a fresh database; the figures."""
    import psycopg
    from sqlalchemy import func, select

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine
    from runner.store.tables import attempts

    name = f"flowrun_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_libpq(server), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.rpartition('/')[0]}/{name}"
    flows = workdir / f"flows-{case}-{daemons}"
    flows.mkdir(parents=True)
    (flows / "scale.yaml").write_text(FLOW % {"case": case})
    (flows / "scale_tasks.py").write_text(TASKS)
    engine = make_engine(url)
    try:
        flow = load_flow(flows / "scale.yaml")
        with engine.begin() as conn:
            create_instances(conn, flow, [{"i": i} for i in range(n)])
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        flowrun = Path(sys.executable).parent / "flowrun"
        argv = [str(flowrun)] if flowrun.exists() else [sys.executable, "-m", "runner.cli"]
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    *argv,
                    "--flows",
                    str(flows),
                    "--db",
                    url,
                    "--daemon",
                    "--exit-when-idle",
                    "--concurrency",
                    "8",
                    "--worker-id",
                    f"b{k}",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(daemons)
        ]
        errors = [p.communicate()[1] for p in procs]
        wall = time.perf_counter() - t0
        for p, err in zip(procs, errors, strict=True):
            if p.returncode != 0:
                raise SystemExit(f"daemon failed ({p.returncode}):\n{err[-2000:]}")
        with engine.connect() as conn:
            moved, first, last = conn.execute(
                select(
                    func.count(), func.min(attempts.c.started_at), func.max(attempts.c.finished_at)
                ).where(attempts.c.outcome == "moved")
            ).one()
    finally:
        engine.dispose()
        with psycopg.connect(_libpq(server), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if moved != 2 * n:
        raise SystemExit(f"expected {2 * n} transitions, found {moved}")
    return {"rate": moved / (last - first), "span": last - first, "wall": wall, "moved": moved}


def main() -> None:
    """Run the cases and print transitions/s and the speed-up over one daemon."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="instances per run (2 transitions each)")
    ap.add_argument("--daemons", default="1,2,4", help="comma-separated daemon counts")
    ap.add_argument("--case", choices=["io", "noop", "both"], default="both")
    ap.add_argument(
        "--server",
        default=os.environ.get(
            "FLOWRUN_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    args = ap.parse_args()
    counts = [int(x) for x in args.daemons.split(",")]
    cases = ["io", "noop"] if args.case == "both" else [args.case]
    print(f"{os.cpu_count()} CPUs; {args.n} instances ({2 * args.n} transitions) per run")
    print(f"{'case':6} {'daemons':>7} {'trans/s':>9} {'speed-up':>9} {'span s':>7} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            base = None
            for k in counts:
                r = run(args.server, case, k, args.n, Path(tmp))
                base = base or r["rate"] if k == counts[0] else base
                speedup = r["rate"] / base if base else 1.0
                print(
                    f"{case:6} {k:>7} {r['rate']:>9.0f} {speedup:>8.2f}x "
                    f"{r['span']:>7.2f} {r['wall']:>7.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
