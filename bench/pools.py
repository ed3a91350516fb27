"""Pools (issue 28), not a test: what keeping a pool's limit inside the claim costs.

1. ``noop``: N instances of a 3-state flow (two no-op ``async def`` call states, then a
   terminal one) drained by ONE ``flowrun --daemon --exit-when-idle --concurrency 64``,
   with no pool and with every handler state in one pool of 64 slots, interleaved
   ``--repeat`` times, on SQLite and on PostgreSQL. Transitions/s from the attempts table
   (as ``bench/throughput.py``); the ratio pool / no pool (goal >= 0.9).
2. ``bound``: 4 daemons on PostgreSQL share a pool of 8; each attempt holds a slot for
   20 ms (``asyncio.sleep``): the pool allows 8 / 0.02 = 400 attempts/s. Attempts/s
   measured between the first start and the last end (goal >= 0.9 x 400/s).
3. ``handoff``: in that run, the wait from a slot freeing to the next attempt starting
   (on any daemon): each handler appends a start and an end line to one ``O_APPEND``
   file; with the pool saturated the k-th end frees the slot the (k+8)-th start takes,
   so ``start[k+8] - end[k]`` (when positive) is a handoff. p50 / p99 (goal <= 10 / 50 ms).
   The end line is written before the outcome commits, so a handoff includes the commit.

4. ``--max-running``: ``noop`` again with the flow's ``max_running: 64`` (a flow limit,
   ``runner.store.flow_limits``) in place of the pool; the ratio limit / no limit.
5. ``--ceiling`` (with ``noop``): a third daemon in each round, no pool at
   ``--concurrency 32``. A pool's slot is held as long as its attempt's lease, from the claim's
   commit to the outcome's, and a daemon holds leases on its running attempts and on as
   many claimed ahead (``--prefetch``, by default its concurrency); so a pool of 64 lets
   a daemon of ``--concurrency 64`` hold 64 leases where it holds 128 without the pool.
   No pool at ``--concurrency 32`` holds the same 64 leases with no pool statement at
   all: what a pool of 64 could reach if it cost nothing. Printed: pool / ceiling.
   PostgreSQL only: a SQLite daemon claims nothing ahead, so its leases are its slots.
   ``--concurrency N`` runs every daemon of ``noop`` at N (default 64; ``0``: the
   daemon's default, 16 a core).

    python bench/pools.py [--n 4000] [--repeat 3] [--bound-n 2000]
                          [--pg postgresql://postgres@127.0.0.1:5432/postgres] [--no-pg]
                          [--max-running] [--no-sqlite] [--cases noop,bound]
                          [--ceiling] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

FLOW = """\
flow: bench
initial: s1
%(pools)s
states:
  s1: {call: "bench_pool_tasks:%(fn)s", next: s2%(pool)s}
  s2: {call: "bench_pool_tasks:%(fn)s", next: done%(pool)s}
  done: {terminal: true}
"""

TASKS = '''\
"""Handlers of bench/pools.py."""
import asyncio, os, time


async def noop(ctx):
    return True


def _line(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


async def io(ctx):
    _line(ctx.data["log"], f"S {time.time():.6f}\\n")
    await asyncio.sleep(0.02)
    _line(ctx.data["log"], f"E {time.time():.6f}\\n")
    return True
'''


@contextmanager
def fresh_pg(server: str) -> Iterator[str]:
    """A new database on ``server`` (a libpq URL); yields its SQLAlchemy URL, drops it."""
    import psycopg

    name = f"benchpools_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = server.rpartition("/")[0].replace("postgresql://", "postgresql+psycopg://")
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def sqlite_url(workdir: Path) -> Iterator[str]:
    """A SQLite file in ``workdir``."""
    yield f"sqlite:///{workdir / 'bench.db'}"


def prepare(
    workdir: Path, url: str, n: int, fn: str, slots: int | None, data: dict, limit: bool = False
) -> dict:
    """The flows folder and ``n`` queued instances (``limit``: ``slots`` is the flow's
    ``max_running``, no pool); returns the daemons' environment."""
    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    flows = workdir / "flows"
    flows.mkdir(parents=True)
    pooled = slots is not None and not limit
    text = FLOW % {
        "fn": fn,
        "pools": f"pools: {{p: {slots}}}" if pooled else f"max_running: {slots}" if limit else "",
        "pool": ", pool: p" if pooled else "",
    }
    (flows / "bench.yaml").write_text(text)
    (flows / "bench_pool_tasks.py").write_text(TASKS)
    engine = make_engine(url)
    flow = load_flow(flows / "bench.yaml")
    with engine.begin() as conn:
        create_instances(conn, flow, [data] * n)
    engine.dispose()
    return {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}


def rate(url: str) -> tuple[float, float]:
    """Moves a second and attempts a second, between the first attempt's start and the
    last one's end."""
    from sqlalchemy import func, select

    from runner.store.db import make_engine
    from runner.store.tables import attempts

    engine = make_engine(url)
    with engine.connect() as conn:
        first, last, moved, total = conn.execute(
            select(
                func.min(attempts.c.started_at),
                func.max(attempts.c.finished_at),
                func.count().filter(attempts.c.outcome == "moved"),
                func.count(),
            )
        ).one()
    engine.dispose()
    return moved / (last - first), total / (last - first)


#: The noop case's pool size (slots).
POOL = 64


def daemon_argv(*extra: str) -> list[str]:
    """``flowrun --daemon --exit-when-idle`` with ``extra``."""
    return [sys.executable, "-m", "runner.cli", "--daemon", "--exit-when-idle", *extra]


def noop_case(
    db: str, n: int, pooled: bool, pg: str, limit: bool = False, concurrency: int = 64
) -> float:
    """One drain of ``n`` no-op instances by one daemon of ``--concurrency concurrency``
    (``0``: its default) (``pooled``: a pool of 64, or with ``limit`` a ``max_running``
    of 64); transitions/s."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        opener = fresh_pg(pg) if db == "postgresql" else sqlite_url(work)
        with opener as url:
            env = prepare(work, url, n, "noop", POOL if pooled else None, {}, limit)
            subprocess.run(
                daemon_argv(*(("--concurrency", str(concurrency)) if concurrency else ())),
                check=True,
                env=env,
                cwd=work,
                stderr=subprocess.DEVNULL,
            )
            return rate(url)[0]


def bound_case(n: int, pg: str, pooled: bool = True) -> dict:
    """``n`` instances of two 20 ms states over 4 daemons on PostgreSQL sharing a pool of
    8 (``pooled``; else no pool and ``--concurrency 2`` each: 8 slots in all, the
    baseline); attempts/s and the handoff waits (ms)."""
    with tempfile.TemporaryDirectory() as tmp, fresh_pg(pg) as url:
        work = Path(tmp)
        log = work / "runs.log"
        env = prepare(work, url, n, "io", 8 if pooled else None, {"log": str(log)})
        each = "8" if pooled else "2"
        procs = [
            subprocess.Popen(
                daemon_argv("--concurrency", each, "--worker-id", f"bench-{k}"),
                env=env,
                cwd=work,
                stderr=subprocess.DEVNULL,
            )
            for k in range(4)
        ]
        for p in procs:
            p.wait(timeout=1800)
        attempts_s = rate(url)[1]
        starts, ends = [], []
        for line in log.read_text().splitlines():
            kind, at = line.split()
            (starts if kind == "S" else ends).append(float(at))
        waits = sorted(
            (starts[k + 8] - ends[k]) * 1000
            for k in range(len(ends))
            if k + 8 < len(starts) and starts[k + 8] > ends[k]
        )
    return {
        "attempts_s": attempts_s,
        "p50": statistics.median(waits) if waits else float("nan"),
        "p99": waits[int(len(waits) * 0.99)] if waits else float("nan"),
        "handoffs": len(waits),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bound-n", type=int, default=2000)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    ap.add_argument(
        "--cases", default="noop,bound", help="which of noop,bound to run (default: both)"
    )
    ap.add_argument("--max-running", action="store_true", help="only case 4 (flow limits)")
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="noop: also no pool at --concurrency 32 (the 64 leases a pool of 64 allows)",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="noop: every daemon's --concurrency (default 64; 0: the daemon's default)",
    )
    args = ap.parse_args()
    dbs = (
        ["sqlite"] if args.no_pg else ["postgresql"] if args.no_sqlite else ["sqlite", "postgresql"]
    )
    cases = set(args.cases.split(","))
    if args.max_running:
        for db in dbs:
            plain, capped = [], []
            for _ in range(args.repeat):  # interleaved
                plain.append(noop_case(db, args.n, False, args.pg))
                capped.append(noop_case(db, args.n, True, args.pg, limit=True))
            a, b = statistics.median(plain), statistics.median(capped)
            print(
                f"noop {db}: no limit {a:,.0f} transitions/s, max_running 64 {b:,.0f}/s "
                f"(medians of {args.repeat}); ratio {b / a:.2f}"
            )
        return
    conc = args.concurrency
    half = POOL // 2  # with as many claimed ahead: the leases a pool of POOL allows
    for db in dbs if "noop" in cases else ():
        plain, pooled, ceiling = [], [], []
        for _ in range(args.repeat):  # interleaved
            plain.append(noop_case(db, args.n, False, args.pg, concurrency=conc))
            pooled.append(noop_case(db, args.n, True, args.pg, concurrency=conc))
            if args.ceiling and db == "postgresql":  # (SQLite claims nothing ahead)
                ceiling.append(noop_case(db, args.n, False, args.pg, concurrency=half))
        a, b = statistics.median(plain), statistics.median(pooled)
        print(
            f"noop {db}, --concurrency {conc or 'default'}: no pool {a:,.0f} transitions/s, "
            f"pool of 64 {b:,.0f}/s (medians of {args.repeat}); ratio {b / a:.2f} "
            f"(goal >= 0.9); runs: "
            + " ".join(f"{x:,.0f}/{y:,.0f}" for x, y in zip(plain, pooled, strict=True))
        )
        if ceiling:
            c = statistics.median(ceiling)
            print(
                f"  ceiling: no pool at --concurrency {half} {c:,.0f}/s ({c / a:.2f} of no "
                f"pool); pool of 64 / ceiling {b / c:.2f}; runs: "
                + " ".join(f"{x:,.0f}" for x in ceiling)
            )
    if not args.no_pg and "bound" in cases:
        for pooled in (False, True):
            t0 = time.perf_counter()
            r = bound_case(args.bound_n, args.pg, pooled)
            what = "a pool of 8" if pooled else "no pool, --concurrency 2 each (baseline)"
            print(
                f"bound postgresql, 4 daemons, {what}, 20 ms: {r['attempts_s']:,.0f} "
                f"attempts/s = {r['attempts_s'] / 400:.2f} x 400/s (goal >= 0.9); handoff "
                f"p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms over {r['handoffs']} "
                f"(goal <= 10 / 50 ms); {time.perf_counter() - t0:.0f} s"
            )


if __name__ == "__main__":
    main()
