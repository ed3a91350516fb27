"""flowrun against the PostgreSQL job queues pgqueuer and procrastinate (not a test).

One PostgreSQL server, a fresh database per run, every system at its own defaults for
durability (``synchronous_commit`` as the server has it). A *job* is one unit of work:
for flowrun one instance of a 2-state flow (a ``call`` state, then a terminal state: one
attempt), for the peers one task. Jobs are queued before the workers start (not timed);
the rate is jobs / (first job started → last job finished), measured inside the workers,
so process start-up is not counted.

Cases:
- ``noop``: N (default 5,000) no-op async jobs, 1 worker process.
- ``io``: N (default 2,000) jobs that ``await asyncio.sleep(0.02)``, concurrency 8 per
  worker, 1 and 4 worker processes.

flowrun runs no-op jobs at ``--concurrency 256`` (its best of 64/128/256: a claim takes
up to the free slots in one statement, a commit the finished ones) and I/O-bound jobs at
8, like the peers.

Peers at their best: pgqueuer with asyncpg (its fastest driver) and batch sizes 10, 100
and, for no-op jobs, 256 (the best is reported; on I/O-bound jobs the batch is capped at
half the concurrency, as pgqueuer requires); procrastinate with LISTEN/NOTIFY (its default) at
concurrency 8 (no-op jobs at 32 were no faster: it fetches one job per round trip).
Durability is equal: every system's tables are logged (pgqueuer's default
``durability=durable``) and commits wait as the server's ``synchronous_commit`` says.

Also measured (flowrun only): the idle cost, transactions/s committed in the database by
1 and 8 idle daemons over ``--idle-seconds`` (``pg_stat_database.xact_commit``), and the
cross-daemon start latency: with two idle daemons running, an instance is created the way
``flowrun start`` does (``create_instance`` in its own transaction) and the time from its
commit to its attempt's start (``attempts.started_at``, the same clock) is taken, 500 times.

    python bench/pg_peers.py [--repeat 2] [--cases noop,io,idle,latency]
        [--server postgresql://postgres@127.0.0.1:5432/test]
        [--compare OLD_TREE] [--systems flowrun,pgqueuer,procrastinate]

``--compare OLD_TREE`` (another checkout, e.g. ``git archive main`` extracted) runs that
checkout's flowrun too, interleaved, as ``flowrun (old)``: with ``--systems flowrun`` an
A/B of two versions on the same server and load.

Each checkout's ``runner`` package is byte-compiled before the runs, as ``pip install``
compiles an installed package (and the peers' code): see :func:`compile_tree`.

Needs the bench extras: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

FLOW = """\
flow: job
initial: s1
defaults:
  try_interval: 1s
states:
  s1: {call: "job_tasks:%(case)s", next: done}
  done: {terminal: true}
"""

TASKS = '''\
"""Handlers for bench/pg_peers.py."""

import asyncio


async def io(ctx):
    await asyncio.sleep(0.02)
    return True


async def noop(ctx):
    return True
'''


# -- databases -------------------------------------------------------------------------------


@contextmanager
def fresh_db(server: str):
    """Create ``pgpeers_<random>`` on ``server`` (a libpq URL); yield its URL; drop it."""
    import psycopg

    name = f"pgpeers_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _sa(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


# -- the workers (run as subprocesses of this script) ----------------------------------------


class Span:
    """First job start and last job end, in ``time.time()`` seconds."""

    def __init__(self) -> None:
        self.first = float("inf")
        self.last = 0.0
        self.count = 0

    def start(self) -> None:
        self.first = min(self.first, time.time())

    def end(self) -> None:
        self.last = max(self.last, time.time())
        self.count += 1

    def dump(self) -> None:
        print(json.dumps({"first": self.first, "last": self.last, "count": self.count}))


async def _pgqueuer_worker(url: str, case: str, concurrency: int, batch: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    span = Span()
    conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("job")
    async def job(_job) -> None:
        span.start()
        if case == "io":
            await asyncio.sleep(0.02)
        span.end()

    if case == "io":  # the same 8 jobs at once as the others (pgqueuer: cap >= 2 x batch)
        batch = min(batch, max(1, concurrency // 2))
    await qm.run(
        batch_size=batch,
        mode=QueueExecutionMode.drain,
        max_concurrent_tasks=concurrency if case == "io" else None,
    )
    span.dump()


async def _procrastinate_worker(url: str, case: str, concurrency: int) -> None:
    from procrastinate import App, PsycopgConnector

    span = Span()
    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="job")
    async def job() -> None:
        span.start()
        if case == "io":
            await asyncio.sleep(0.02)
        span.end()

    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False
        )
    span.dump()


def worker_main(args: argparse.Namespace) -> None:
    import logging

    logging.disable(logging.WARNING)
    if args.worker == "pgqueuer":
        asyncio.run(_pgqueuer_worker(args.url, args.case, args.concurrency, args.batch))
    else:
        asyncio.run(_procrastinate_worker(args.url, args.case, args.concurrency))


# -- queueing ----------------------------------------------------------------------------------


async def _queue_pgqueuer(url: str, n: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(url)
    q = Queries(AsyncpgDriver(conn))
    await q.install()
    for i in range(0, n, 1000):
        k = min(1000, n - i)
        await q.enqueue(["job"] * k, [None] * k, [0] * k)
    await conn.close()


async def _queue_procrastinate(url: str, n: int) -> None:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="job")
    async def job() -> None:  # pragma: no cover - only deferred here
        pass

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for i in range(0, n, 1000):
            await job.batch_defer_async(*[{} for _ in range(min(1000, n - i))])


def _flowrun_flows(workdir: Path, case: str) -> Path:
    flows = workdir / f"flows-{case}-{uuid.uuid4().hex[:6]}"
    flows.mkdir(parents=True)
    (flows / "job.yaml").write_text(FLOW % {"case": case})
    (flows / "job_tasks.py").write_text(TASKS)
    return flows


def _flowrun_argv(tree: Path | None = None) -> list[str]:
    """How to start flowrun: this checkout's, or the one in ``tree`` (``--compare``)."""
    script = Path(sys.executable).parent / "flowrun"
    if tree is None and script.exists():
        return [str(script)]
    return [sys.executable, "-m", "runner.cli"]


def compile_tree(tree: Path) -> None:
    """Byte-compile the ``runner`` package of the checkout ``tree``, as ``pip install``
    does for an installed package (and for the peers). With ``PYTHONDONTWRITEBYTECODE``
    set (this environment sets it), a checkout never compiled is compiled again by every
    daemon launch: ~100 ms of CPU each, four times at once on 2 cores with 4 workers
    (``bench/cli_latency.py`` does the same for its installs)."""
    import compileall

    compileall.compile_dir(str(tree / "runner"), quiet=1)


def _env(tree: Path | None = None) -> dict:
    """The environment of a child: no ``FLOWRUN_*`` settings, ``tree`` (default: this
    checkout) first on the import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    root = str(tree or ROOT)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


# -- runs --------------------------------------------------------------------------------------


def run_flowrun(
    server: str,
    case: str,
    workers: int,
    n: int,
    workdir: Path,
    concurrency: int = 8,
    tree: Path | None = None,
) -> float:
    """Jobs/s of ``workers`` flowrun daemons (``--concurrency``) draining ``n`` instances;
    the daemons are those of the checkout ``tree`` when given (``--compare``; the
    instances are created by this checkout's code either way)."""
    from sqlalchemy import func, select

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine
    from runner.store.tables import attempts

    with fresh_db(server) as url:
        flows = _flowrun_flows(workdir, case)
        engine = make_engine(_sa(url))
        try:
            flow = load_flow(flows / "job.yaml")
            with engine.begin() as conn:
                create_instances(conn, flow, [{"i": i} for i in range(n)])
            procs = [
                subprocess.Popen(
                    [
                        *_flowrun_argv(tree),
                        "--flows",
                        str(flows),
                        "--db",
                        _sa(url),
                        "--daemon",
                        "--exit-when-idle",
                        "--concurrency",
                        str(concurrency),
                        "--worker-id",
                        f"w{k}",
                    ],
                    env=_env(tree),
                    cwd=str(tree or ROOT),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for k in range(workers)
            ]
            for p in procs:
                err = p.communicate()[1]
                if p.returncode:
                    raise SystemExit(f"flowrun daemon failed ({p.returncode}): {err[-2000:]}")
            with engine.connect() as conn:
                first, last, done = conn.execute(
                    select(
                        func.min(attempts.c.started_at),
                        func.max(attempts.c.finished_at),
                        func.count(),
                    ).where(attempts.c.outcome == "moved")
                ).one()
            assert done == n, (done, n)
            return n / (last - first)
        finally:
            engine.dispose()


def run_peer(server: str, peer: str, case: str, workers: int, n: int, batch: int = 10) -> float:
    """Jobs/s of ``workers`` pgqueuer or procrastinate processes draining ``n`` jobs."""
    with fresh_db(server) as url:
        queue = _queue_pgqueuer if peer == "pgqueuer" else _queue_procrastinate
        asyncio.run(queue(url, n))
        argv = [
            sys.executable,
            __file__,
            "--worker",
            peer,
            "--url",
            url,
            "--case",
            case,
            "--concurrency",
            "8",
            "--batch",
            str(batch),
        ]
        procs = [
            subprocess.Popen(
                argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(workers)
        ]
        spans = []
        for p in procs:
            out, err = p.communicate()
            if p.returncode:
                raise SystemExit(f"{peer} worker failed ({p.returncode}): {err[-2000:]}")
            spans.append(json.loads(out.strip().splitlines()[-1]))
        count = sum(s["count"] for s in spans)
        assert count == n, (peer, count, n)
        first = min(s["first"] for s in spans if s["count"])
        last = max(s["last"] for s in spans if s["count"])
        return n / (last - first)


def throughput(
    server: str,
    repeat: int,
    workdir: Path,
    cases: list[str],
    n_noop: int,
    n_io: int,
    compare: Path | None = None,
    only: list[str] | None = None,
) -> list[tuple[str, dict[str, float]]]:
    """Median jobs/s per system and configuration, runs interleaved ``repeat`` times.

    ``compare`` (another checkout): its flowrun runs too, as ``flowrun (old)``, between
    this one's and the peers; ``only``: the systems to run (``flowrun``, ``pgqueuer``,
    ``procrastinate``; default all)."""
    only = only or ["flowrun", "pgqueuer", "procrastinate"]
    configs: list[tuple[str, str, int, int]] = []
    if "noop" in cases:
        configs.append(("noop, 1 worker", "noop", 1, n_noop))
    if "io" in cases:
        configs += [("io, 1 worker", "io", 1, n_io), ("io, 4 workers", "io", 4, n_io)]
    rows = []
    for label, case, workers, n in configs:
        conc = 256 if case == "noop" else 8  # flowrun's best for no-op jobs; the 8 for io
        flowrun = partial(run_flowrun, server, case, workers, n, workdir, conc)
        peer = partial(run_peer, server)
        systems = {
            "flowrun": flowrun,
            "flowrun (old)": partial(flowrun, tree=compare) if compare else None,
            "pgqueuer b10": partial(peer, "pgqueuer", case, workers, n, 10),
            "pgqueuer b100": partial(peer, "pgqueuer", case, workers, n, 100),
            # (on I/O-bound jobs every batch is capped at half the concurrency: one is enough)
            "pgqueuer b256": partial(peer, "pgqueuer", case, workers, n, 256)
            if case == "noop"
            else None,
            "procrastinate": partial(peer, "procrastinate", case, workers, n),
        }
        chosen = {k: fn for k, fn in systems.items() if fn is not None and k.split()[0] in only}
        runs: dict[str, list[float]] = {}
        for _ in range(repeat):
            for name, fn in chosen.items():
                runs.setdefault(name, []).append(fn())
        med = {k: statistics.median(v) for k, v in runs.items()}
        if "pgqueuer" in only:
            best = [
                med.pop(k) for k in ("pgqueuer b10", "pgqueuer b100", "pgqueuer b256") if k in med
            ]
            med["pgqueuer (best)"] = max(best)
        rows.append((label, med))
        print(f"{label}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in med.items()), flush=True)
        if "flowrun" in med:
            ratios = [
                f"flowrun/{k} {med['flowrun'] / med[k]:.2f}x"
                for k in ("pgqueuer (best)", "procrastinate", "flowrun (old)")
                if k in med
            ]
            print("  ratios: " + ", ".join(ratios), flush=True)
    return rows


def _xact_commit(server: str, db: str) -> int:
    import psycopg

    with psycopg.connect(server, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (db,)
        ).fetchone()
        return int(row[0])


def _wait_registered(url: str, daemons: int, timeout: float = 120.0) -> None:
    """Wait until ``daemons`` workers have registered their row in ``url``'s database."""
    import psycopg

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with psycopg.connect(url, autocommit=True) as c:
                n = c.execute("SELECT count(*) FROM workers WHERE stopped_at IS NULL").fetchone()
                if n and n[0] >= daemons:
                    return
        except psycopg.Error:
            pass  # the tables are not there yet
        time.sleep(0.2)
    raise SystemExit(f"{daemons} daemons did not register within {timeout:.0f}s")


@contextmanager
def idle_daemons(flows: Path, url: str, daemons: int, prefix: str):
    """``daemons`` flowrun daemons on ``url`` (libpq form), registered when this yields;
    terminated (and waited for) at the end."""
    argv = [*_flowrun_argv(), "--flows", str(flows), "--db", _sa(url), "--daemon"]
    procs = [
        subprocess.Popen(
            [*argv, "--worker-id", f"{prefix}{k}"],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for k in range(daemons)
    ]
    try:
        _wait_registered(url, daemons)
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


def idle_cost(
    server: str, daemons: int, seconds: float, workdir: Path, settle: float = 12.0
) -> float:
    """Transactions/s committed in a fresh database by ``daemons`` idle flowrun daemons,
    counted from ``settle`` seconds after they registered: start-up is not idle time, and
    a backend reports a commit made within 1 s of its last report up to 10 s later
    (PostgreSQL's PGSTAT_MIN_INTERVAL and PGSTAT_IDLE_INTERVAL)."""
    with fresh_db(server) as url:
        db = url.rpartition("/")[2]
        flows = _flowrun_flows(workdir, "noop")
        with idle_daemons(flows, url, daemons, "idle"):
            time.sleep(settle)
            before = _xact_commit(server, db)
            time.sleep(seconds)
            after = _xact_commit(server, db)
        return (after - before) / seconds


def start_latency(server: str, starts: int, workdir: Path) -> tuple[float, float]:
    """p50/p99 seconds from a committed start to its attempt's start, two idle daemons."""
    from sqlalchemy import select

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instance
    from runner.store.db import make_engine
    from runner.store.tables import attempts

    with fresh_db(server) as url:
        flows = _flowrun_flows(workdir, "noop")
        engine = make_engine(_sa(url))
        try:
            with idle_daemons(flows, url, 2, "lat"):
                flow = load_flow(flows / "job.yaml")
                time.sleep(1.0)
                committed: dict[int, float] = {}
                for _ in range(starts):
                    with engine.begin() as conn:
                        iid = create_instance(conn, flow, {})
                    committed[iid] = time.time()
                    time.sleep(0.02)
                deadline = time.time() + 30
                while time.time() < deadline:
                    with engine.connect() as conn:
                        query = select(attempts.c.instance_id, attempts.c.started_at)
                        rows = conn.execute(query).all()
                    if len(rows) >= starts:
                        break
                    time.sleep(0.2)
                lat = sorted(started - committed[iid] for iid, started in rows if iid in committed)
                return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        finally:
            engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cases", default="noop,io,idle,latency")
    ap.add_argument("--n-noop", type=int, default=5000)
    ap.add_argument("--n-io", type=int, default=2000)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--idle-settle", type=float, default=12.0, help="seconds idle before counting")
    ap.add_argument("--starts", type=int, default=500)
    ap.add_argument(
        "--compare",
        type=Path,
        help="another checkout (e.g. `git archive main` extracted): its flowrun runs too, "
        "interleaved, as 'flowrun (old)'",
    )
    ap.add_argument(
        "--systems",
        default="flowrun,pgqueuer,procrastinate",
        help="which systems run (flowrun alone with --compare: an A/B of two checkouts)",
    )
    # internal: run one peer worker
    ap.add_argument("--worker", choices=["pgqueuer", "procrastinate"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=10, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return
    cases = args.cases.split(",")
    for tree in filter(None, (ROOT, args.compare)):
        compile_tree(tree)
    print(f"PostgreSQL peers, {os.cpu_count()} cores, repeat {args.repeat} (medians)")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        throughput(
            args.server,
            args.repeat,
            workdir,
            cases,
            args.n_noop,
            args.n_io,
            args.compare,
            args.systems.split(","),
        )
        if "idle" in cases:
            for k in (1, 8):
                tps = idle_cost(args.server, k, args.idle_seconds, workdir, args.idle_settle)
                print(f"idle cost, {k} daemon(s): {tps:.2f} transactions/s", flush=True)
        if "latency" in cases:
            p50, p99 = start_latency(args.server, args.starts, workdir)
            print(f"cross-daemon start latency: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")


if __name__ == "__main__":
    main()
