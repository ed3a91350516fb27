"""The CPU a job costs in a worker's database cycles on PostgreSQL, without a worker loop
(not a test).

N no-op instances of a 2-state flow (a ``call`` state, then a terminal one) are queued in
a fresh database; then one connection runs the worker's cycles back to back, as
``runner.engine.cycle`` does: in one transaction, plan by index (``store.leases.by_index``,
where the checkout has it), commit the previous batch's outcomes
(``store.commit.commit_outcomes``, each attempt ``moved`` to the terminal state) and claim
the next batch (``store.leases.claim_batch``), with ``store.leases.recover_lost`` once a
second of the run, as a worker asks for it. Measured per statement and per job: the
server backend's CPU time (``/proc/<pid>/schedstat`` of the connection's backend: the
server must run on this machine) and this process's CPU time (``time.process_time``).
CPU time, so the machine's load matters less than for a rate (still: note it).

    python bench/pg_cycles.py [--n 10000] [--batch 64] [--repeat 3]
        [--server postgresql://postgres@127.0.0.1:5432/test] [--compare OLD_TREE]
        [--setup SQL ...]

``--compare OLD_TREE`` (another checkout, e.g. ``git archive main`` extracted) runs the
same cycles with that checkout's ``runner`` in turn with this one's (each side creates
its own database and schema), and prints both.

``--daemons`` measures a whole daemon instead (``flowrun --daemon --exit-when-idle
--concurrency 256``, the call handler a no-op coroutine): the CPU of the daemon's process
(``wait4``'s rusage) and of its backends (their ``schedstat``, read every 20 ms while it
runs), for ``--n`` jobs and for ``--n-small`` jobs; a job costs the difference divided by
the difference in jobs (so start-up is not counted).
"""

from __future__ import annotations

import argparse
import json
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

ROOT = Path(__file__).resolve().parent.parent

FLOW = """\
flow: job
initial: s1
states:
  s1: {call: "%s", next: done}
  done: {terminal: true}
"""


@contextmanager
def fresh_db(server: str) -> Iterator[tuple[str, str]]:
    """A new database on ``server`` (a libpq URL): yields its name and SQLAlchemy URL,
    drops it after."""
    import psycopg

    name = f"pgcycles_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield (
            name,
            server.rpartition("/")[0].replace("postgresql://", "postgresql+psycopg://")
            + "/"
            + name,
        )
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: the rows printed, in this order
PARTS = ("commit", "claim", "COMMIT", "recover", "all")


def _backend_ns(pid: int) -> int:
    """CPU nanoseconds a server backend has used (first field of its ``schedstat``)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def child(server: str, n: int, batch: int, setup: list[str]) -> dict:
    """Run the cycles with the ``runner`` on the import path (``setup``: SQL run once the
    schema is made, before the instances are queued); returns
    ``{part: [server us a job, client us a job]}`` and ``seconds``."""
    from sqlalchemy import text

    from runner.engine.outcomes import decide
    from runner.flowspec.compiler import load_flow
    from runner.handlers.attempt import AttemptResult
    from runner.store import commit, leases
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    with fresh_db(server) as (name, url):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "job.yaml"
            path.write_text(FLOW % "json:dumps")
            flow = load_flow(path)
        engine = make_engine(url)
        with engine.begin() as conn:
            for sql in setup:
                conn.execute(text(sql))
            create_instances(conn, flow, [{"i": i} for i in range(n)])
        server_ns = dict.fromkeys(PARTS, 0)
        client_s = dict.fromkeys(PARTS, 0.0)
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            conn.commit()
            steer = getattr(leases, "by_index", None)  # (an older checkout has none)
            pending: list = []
            done = 0
            last_recover = 0.0
            start = time.time()
            while True:
                s0, c0 = _backend_ns(pid), time.process_time()
                with conn.begin() as tx:
                    if steer is not None:  # as the worker's cycle does (counted in commit)
                        steer(conn)
                    at = time.time()
                    outcomes = [
                        decide(flow, c, AttemptResult("moved", c.data, to_state="done"), c.data, at)
                        for c in pending
                    ]
                    commit.commit_outcomes(conn, "w0", outcomes, lease=60.0)
                    s1, c1 = _backend_ns(pid), time.process_time()
                    recover = 0 if at - last_recover < 1.0 else 1
                    if recover:
                        leases.recover_lost(conn, lambda v, s: None)  # None: no restart allowed
                        last_recover = at
                    s2, c2 = _backend_ns(pid), time.process_time()
                    claims = leases.claim_batch(conn, "w0", 60.0, batch)
                    s3, c3 = _backend_ns(pid), time.process_time()
                    tx.commit()
                s4, c4 = _backend_ns(pid), time.process_time()
                for part, (sa, sb, ca, cb) in {
                    "commit": (s0, s1, c0, c1),
                    "recover": (s1, s2, c1, c2),
                    "claim": (s2, s3, c2, c3),
                    "COMMIT": (s3, s4, c3, c4),
                    "all": (s0, s4, c0, c4),
                }.items():
                    server_ns[part] += sb - sa
                    client_s[part] += cb - ca
                done += len(pending)
                pending = claims
                if not claims:
                    break
            seconds = time.time() - start
        engine.dispose()
        assert done == n, (done, n)
        return {
            "seconds": seconds,
            **{p: [server_ns[p] / 1e3 / n, client_s[p] * 1e6 / n] for p in PARTS},
        }


def daemon_child(server: str, n: int) -> dict:
    """One daemon of the ``runner`` on the import path draining ``n`` no-op instances;
    returns ``{"server": s, "client": s, "seconds": s}`` (CPU seconds and wall time)."""
    import psycopg

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    with fresh_db(server) as (name, url):
        with tempfile.TemporaryDirectory() as tmp:
            flows = Path(tmp)
            (flows / "job.yaml").write_text(FLOW % "job_tasks:noop")
            (flows / "job_tasks.py").write_text("async def noop(ctx):\n    return True\n")
            engine = make_engine(url)
            with engine.begin() as conn:
                create_instances(conn, load_flow(flows / "job.yaml"), [{"i": i} for i in range(n)])
            engine.dispose()
            argv = [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", url]
            argv += ["--daemon", "--exit-when-idle", "--concurrency", "256", "--worker-id", "w0"]
            start = time.time()
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            seen: dict[int, int] = {}
            with psycopg.connect(server, autocommit=True) as watch:
                while True:
                    done, _status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if done:
                        break
                    if time.time() - start > 600:
                        proc.kill()
                        raise SystemExit("the daemon did not finish in 600 s")
                    pids = watch.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,)
                    ).fetchall()
                    for (pid,) in pids:
                        try:
                            seen[pid] = _backend_ns(pid)
                        except OSError:
                            pass
                    time.sleep(0.02)
            seconds = time.time() - start
        return {
            "server": sum(seen.values()) / 1e9,
            "client": usage.ru_utime + usage.ru_stime,
            "seconds": seconds,
        }


def _run(tree: Path | None, args: argparse.Namespace, n: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree or ROOT), env.get("PYTHONPATH")]))
    for _attempt in range(3):  # the server may be restarted by someone else meanwhile
        out = _child(tree, args, n, env)
        if out.returncode == 0:
            break
        print(f"# a run failed, again in 10 s: {out.stderr[-300:]}", file=sys.stderr)
        time.sleep(10)
    if out.returncode:
        raise SystemExit(f"a run failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(tree: Path | None, args: argparse.Namespace, n: int | None, env: dict):
    return subprocess.run(
        [sys.executable, __file__, "--child", "--server", args.server]
        + ["--n", str(n or args.n), "--batch", str(args.batch)]
        + (["--daemons"] if args.daemons else [])
        + [x for sql in args.setup for x in ("--setup", sql)],
        env=env,
        cwd=str(tree or ROOT),
        capture_output=True,
        text=True,
    )


def main() -> None:
    """Parse the options; run the repeats interleaved; print the medians."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--compare", type=Path, default=None, help="another checkout (A/B)")
    p.add_argument(
        "--setup", action="append", default=[], help="SQL run before queuing (both sides)"
    )
    p.add_argument("--daemons", action="store_true", help="a whole daemon (see above)")
    p.add_argument("--n-small", type=int, default=1000, help="--daemons: the start-up run")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        if args.daemons:
            print(json.dumps(daemon_child(args.server, args.n)))
        else:
            print(json.dumps(child(args.server, args.n, args.batch, args.setup)))
        return
    if args.daemons:
        daemons(args)
        return
    sides = {"new": None, **({"old": args.compare} if args.compare else {})}
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.repeat):
        for side, tree in sides.items() if r % 2 == 0 else reversed(sides.items()):
            runs[side].append(_run(tree, args))
            print(f"# {side} run {r + 1}: {json.dumps(runs[side][-1])}", file=sys.stderr)
    print(f"load {os.getloadavg()[0]:.1f}; {args.n} jobs, batches of {args.batch}; us a job")
    print(f"{'part':10}" + "".join(f"{s + ' server':>14}{s + ' client':>14}" for s in sides))
    for part in PARTS:
        row = f"{part:10}"
        for side in sides:
            for k in (0, 1):
                row += f"{statistics.median(x[part][k] for x in runs[side]):14.1f}"
        print(row)
    for side in sides:
        rate = statistics.median(args.n / x["seconds"] for x in runs[side])
        print(f"{side}: {rate:,.0f} jobs/s (cycles alone)")


def daemons(args: argparse.Namespace) -> None:
    """``--daemons``: interleaved runs of ``--n`` and ``--n-small`` jobs per side; prints
    the medians of the CPU a job (server, client) and of the rate of the large runs."""
    sides = {"new": None, **({"old": args.compare} if args.compare else {})}
    runs: dict[str, list[tuple[dict, dict]]] = {s: [] for s in sides}
    for r in range(args.repeat):
        for side, tree in sides.items() if r % 2 == 0 else reversed(sides.items()):
            big, small = _run(tree, args), _run(tree, args, args.n_small)
            runs[side].append((big, small))
            print(f"# {side} run {r + 1}: {json.dumps([big, small])}", file=sys.stderr)
    jobs = args.n - args.n_small
    print(f"load {os.getloadavg()[0]:.1f}; daemons, {args.n} - {args.n_small} jobs; us a job")
    for side in sides:
        server = statistics.median((b["server"] - s["server"]) / jobs * 1e6 for b, s in runs[side])
        client = statistics.median((b["client"] - s["client"]) / jobs * 1e6 for b, s in runs[side])
        rate = statistics.median(args.n / b["seconds"] for b, _ in runs[side])
        print(f"{side}: server {server:.1f}, client {client:.1f}; {rate:,.0f} jobs/s (wall)")


if __name__ == "__main__":
    main()
