"""Throughput: flowrun transitions/s against huey's SqliteHuey tasks/s (not a test).

flowrun: N instances of a 3-state flow (two ``call`` states with no-op ``async def``
handlers, then a terminal state) drained by ONE ``flowrun --daemon --exit-when-idle``
process on a SQLite file; a "transition" is one committed attempt that moved an instance
(2 per instance).
The rate is transitions / (last attempt finished - first attempt started), read back from
the attempts table; the wall time of the whole process (start-up included) is printed too.

huey (the peer): the same N no-op tasks through ``SqliteHuey`` with 2 worker threads (the
comparison's fixed peer configuration; ``--huey-workers 1`` runs huey's own consumer
default, which is the faster one on a 2-core machine), at huey's defaults and again with
``synchronous=NORMAL`` to match flowrun (``huey_peer.py``).

Case ``fail_once``: every handler/task fails on its first try and succeeds on
the second (flowrun: backoff 0, the error is recorded and spent from the budget; huey:
``retries=1, retry_delay=0``).

Case ``exec`` (N defaults to 2,000): both states run ``exec: [/bin/true]``;
huey's task calls ``subprocess.run(["/bin/true"])``, in each of its worker configurations
(1 and 2 threads, 2 processes; storage defaults and ``synchronous=NORMAL``), and its best
is the peer. The *spawn ceiling* is the fastest of a sequential ``subprocess.run`` loop and
a pool of 2 x cores threads doing the same, measured in this process between the others.
``--setup`` adds the same flow with each state's handler set up: ``env`` (5 names, two
of them ``{data.…}`` templates), one secret file and ``limits`` (memory, cpu, files),
run right after the plain flow in even repetitions and right before it in odd ones (a
pair), and prints each pair's ratio, the median of those ratios beside the ratio of the
medians, and the CPU a transition of both: the daemon's and its reaped children's with
start-up (``getrusage``), and, while the attempts ran, the daemon's own and its
handlers' apart (its ``/proc/PID/stat`` read every 10 ms).

Each flowrun figure is taken twice, interleaved: at the daemon's default ``--concurrency``
(no option given: what a user who sets nothing gets) and at this bench's best
(``--concurrency``, 64); both are printed, with their medians over ``--repeat``.
``--skip-default`` runs only the best.

    python bench/throughput.py [--n 10000] [--concurrency 64] [--skip-default]
                               [--case noop|fail_once|both|exec] [--repeat 5] [--huey-workers 2]
                               [--setup]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

FLOW = """\
flow: bench
description: 3 states, no-op call handlers
initial: s1
defaults:
  try_interval: 1s
  backoff: {initial: 0s, factor: 1, max: 0s, jitter: none}
states:
  s1: {call: "bench_tasks:%(fn)s", next: s2}
  s2: {call: "bench_tasks:%(fn)s", next: done}
  done: {terminal: true}
"""

EXEC_FLOW = """\
flow: bench
description: 2 states, each runs /bin/true
initial: s1
states:
  s1: {exec: [/bin/true], next: s2}
  s2: {exec: [/bin/true], next: done}
  done: {terminal: true}
"""

EXEC_SETUP_FLOW = """\
flow: bench
description: 2 states, each runs /bin/true with env, a secret and limits
initial: s1
defaults:
  env: {REGION: "eu-{data.i}", TIER: gold, BATCH: "{data.i}", MODE: bench, COLOR: blue}
  secrets: {API_KEY: {file: api.key}}
states:
  s1: {exec: [/bin/true], next: s2, limits: {memory: 512MiB, cpu: 60s, files: 1024}}
  s2: {exec: [/bin/true], next: done, limits: {memory: 512MiB, cpu: 60s, files: 1024}}
  done: {terminal: true}
"""

TASKS = '''\
"""No-op handlers for bench/throughput.py."""


async def noop(ctx):
    return True


async def fail_once(ctx):
    if ctx.attempt % 2 == 1:
        raise RuntimeError("fail once")
    return True
'''


def run_flowrun(
    n: int,
    concurrency: int | None,
    case: str,
    workdir: Path,
    extra: tuple[str, ...] = (),
    root: Path | None = None,
) -> dict:
    """Drain ``n`` instances with one daemon at ``concurrency`` (``None``: the daemon's
    default; ``extra``: more daemon options; ``root``: the flowrun of that source tree,
    default this one); returns the figures."""
    from sqlalchemy import func, select

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine
    from runner.store.tables import attempts

    flows = workdir / "flows"
    flows.mkdir(parents=True)
    texts = {"exec": EXEC_FLOW, "exec-setup": EXEC_SETUP_FLOW}
    (flows / "bench.yaml").write_text(texts.get(case) or FLOW % {"fn": case})
    (flows / "api.key").write_text("not-a-real-key\n")
    (flows / "bench_tasks.py").write_text(TASKS)
    url = f"sqlite:///{workdir / 'bench.db'}"
    engine = make_engine(url)
    flow = load_flow(flows / "bench.yaml")
    with engine.begin() as conn:
        create_instances(conn, flow, [{"i": i} for i in range(n)])
    env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    t0 = time.perf_counter()
    cpu0 = _children_cpu()
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner.cli",
            "--daemon",
            "--exit-when-idle",
            *(["--concurrency", str(concurrency)] if concurrency is not None else []),
            "--log-format",
            "json",
            *extra,
        ],
        env=env,
        cwd=workdir,
        stderr=subprocess.DEVNULL,
    )
    samples = _sample_cpu(daemon)
    if daemon.returncode:
        raise subprocess.CalledProcessError(daemon.returncode, daemon.args)
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0  # the daemon's user + system CPU seconds, start-up included
    with engine.connect() as conn:
        first, last = conn.execute(
            select(func.min(attempts.c.started_at), func.max(attempts.c.finished_at))
        ).one()
        moved = conn.execute(select(func.count()).where(attempts.c.outcome == "moved")).scalar_one()
        total = conn.execute(select(func.count()).select_from(attempts)).scalar_one()
    # while the attempts ran (start-up and exit left out): the daemon's own CPU and its
    # handlers' (the children it reaped), from its /proc/PID/stat read every 10 ms
    own = (_at(samples, last, 1) - _at(samples, first, 1)) / max(moved, 1) * 1e6
    handlers = (_at(samples, last, 2) - _at(samples, first, 2)) / max(moved, 1) * 1e6
    secs = last - first
    return {
        "transitions": moved,
        "attempts": total,
        "seconds": secs,
        "per_s": moved / secs,
        "wall": wall,
        "cpu_us": cpu / max(moved, 1) * 1e6,
        "daemon_us": own,
        "handlers_us": handlers,
    }


def _sample_cpu(proc: subprocess.Popen[bytes]) -> list[tuple[float, float, float]]:
    """``(time.time(), the process's own CPU seconds, its reaped children's)`` every 10 ms
    until ``proc`` exits (``/proc/PID/stat``: clock ticks, 10 ms); waits for it."""
    tick = os.sysconf("SC_CLK_TCK")
    samples = []
    path = f"/proc/{proc.pid}/stat"
    while proc.poll() is None:
        try:
            with open(path, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            break
        utime, stime, cutime, cstime = (int(x) / tick for x in fields[11:15])
        samples.append((time.time(), utime + stime, cutime + cstime))
        time.sleep(0.01)
    proc.wait()
    return samples or [(0.0, 0.0, 0.0)]


def _at(samples: list[tuple[float, float, float]], when: float, i: int) -> float:
    """Item ``i`` of ``samples`` at time ``when`` (epoch seconds), linearly interpolated."""
    before = max((s for s in samples if s[0] <= when), default=samples[0], key=lambda s: s[0])
    after = min((s for s in samples if s[0] >= when), default=samples[-1], key=lambda s: s[0])
    if after[0] == before[0]:
        return before[i]
    return before[i] + (after[i] - before[i]) * (when - before[0]) / (after[0] - before[0])


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_huey(
    n: int, sync: str, case: str, workdir: Path, workers: int = 2, kind: str = "thread"
) -> dict:
    """Drain ``n`` tasks through SqliteHuey (``workers`` threads or processes) in a
    subprocess; returns its figures."""
    path = workdir / f"huey-{sync}-{workers}{kind}.db"
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "huey_peer.py"),
            str(n),
            str(path),
            sync,
            case,
            str(workers),
            kind,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def spawn_ceiling(n: int) -> dict[str, float]:
    """``/bin/true`` runs per second: a sequential ``subprocess.run`` loop, and a pool of
    2 x cores threads doing the same."""
    argv = ["/bin/true"]
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(argv, check=True)
    seq = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
        for _ in pool.map(lambda _: subprocess.run(argv, check=True), range(n)):
            pass
    return {"sequential": seq, "threads": n / (time.perf_counter() - t0)}


HUEY_CONFIGS = [(1, "thread"), (2, "thread"), (2, "process")]
#: The key of the figures taken at the daemon's default ``--concurrency``.
DEFAULT = "flowrun at the default"


def sides(args: argparse.Namespace, r: int) -> list[tuple[str, int | None]]:
    """The flowrun runs of repetition ``r``: ``("flowrun", --concurrency)`` and, unless
    ``--skip-default``, ``(DEFAULT, None)``, in alternating order."""
    runs: list[tuple[str, int | None]] = [("flowrun", args.concurrency)]
    if not args.skip_default:
        runs.append((DEFAULT, None))
    return runs if r % 2 == 0 else runs[::-1]


def main_exec(args: argparse.Namespace) -> None:
    """The ``exec`` case: flowrun against huey's best configuration and the spawn ceiling,
    interleaved; medians over ``--repeat``."""
    n = args.n or 2_000
    rates: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        rates.setdefault(key, []).append(value)

    def setup_run(tmp: str, r: int) -> None:
        su = run_flowrun(n, args.concurrency, "exec-setup", Path(tmp) / "setup")
        add("flowrun (setup)", su["per_s"])
        for what in ("cpu", "daemon", "handlers"):
            add(f"flowrun (setup) {what}", su[f"{what}_us" if what != "cpu" else "cpu_us"])
        print(
            f"[exec {r + 1}] flowrun with env, a secret and limits: {su['per_s']:,.0f}/s; CPU a "
            f"transition, its /bin/true included: {su['cpu_us']:,.0f} us (while running: "
            f"daemon {su['daemon_us']:,.0f}, handlers {su['handlers_us']:,.0f})",
            flush=True,
        )

    for r in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="flowrun-bench-") as tmp:
            # the set-up flow right before the plain one in every other repetition, right
            # after it in the others: neither side always gets the later slot
            if args.setup and r % 2 == 1:
                setup_run(tmp, r)
            for key, conc in sides(args, r):
                fr = run_flowrun(n, conc, "exec", Path(tmp) / key.replace(" ", "-"))
                add(key, fr["per_s"])
                add(f"{key} cpu", fr["cpu_us"])
                add(f"{key} daemon", fr["daemon_us"])
                add(f"{key} handlers", fr["handlers_us"])
                print(
                    f"[exec {r + 1}] {key}: {fr['transitions']} transitions in "
                    f"{fr['seconds']:.2f}s = {fr['per_s']:,.0f}/s (process wall "
                    f"{fr['wall']:.2f}s, concurrency {conc or 'default'}; CPU a transition "
                    f"{fr['cpu_us']:,.0f} us, while running: daemon {fr['daemon_us']:,.0f}, "
                    f"handlers {fr['handlers_us']:,.0f})",
                    flush=True,
                )
            if args.setup and r % 2 == 0:
                setup_run(tmp, r)
            if args.setup:
                add("setup/plain", rates["flowrun (setup)"][-1] / rates["flowrun"][-1])
                print(
                    f"[exec {r + 1}] set-up/plain (this pair): {rates['setup/plain'][-1]:.2f}x; "
                    f"CPU a transition {rates['flowrun (setup) cpu'][-1]:,.0f} against "
                    f"{rates['flowrun cpu'][-1]:,.0f} us; while running, daemon "
                    f"{rates['flowrun (setup) daemon'][-1]:,.0f} against "
                    f"{rates['flowrun daemon'][-1]:,.0f} us, handlers "
                    f"{rates['flowrun (setup) handlers'][-1]:,.0f} against "
                    f"{rates['flowrun handlers'][-1]:,.0f} us",
                    flush=True,
                )
            if args.compare:
                old = run_flowrun(
                    n, args.concurrency, "exec", Path(tmp) / "compare", root=Path(args.compare)
                )
                add("flowrun (compare)", old["per_s"])
                print(
                    f"[exec {r + 1}] flowrun of {args.compare}: {old['per_s']:,.0f}/s", flush=True
                )
            if not args.skip_huey:
                best = 0.0
                for workers, kind in HUEY_CONFIGS:
                    for sync in ("default", "normal"):
                        hr = run_huey(n, sync, "exec", Path(tmp), workers, kind)
                        add(f"huey {workers} {kind} {sync}", hr["per_s"])
                        best = max(best, hr["per_s"])
                        print(
                            f"[exec {r + 1}] huey {workers} {kind}(s) {sync}: "
                            f"{hr['per_s']:,.0f} tasks/s",
                            flush=True,
                        )
                add("huey best", best)
            ceiling = spawn_ceiling(n)
            for k, v in ceiling.items():
                add(f"ceiling {k}", v)
            add("ceiling", max(ceiling.values()))
            print(
                f"[exec {r + 1}] spawn ceiling: sequential {ceiling['sequential']:,.0f}/s, "
                f"threads {ceiling['threads']:,.0f}/s",
                flush=True,
            )
            line = f"[exec {r + 1}] ratios (this run): flowrun/ceiling "
            line += f"{rates['flowrun'][-1] / rates['ceiling'][-1]:.2f}x"
            if DEFAULT in rates:
                line += f", at the default {rates[DEFAULT][-1] / rates['ceiling'][-1]:.2f}x"
            if "huey best" in rates:
                line += f", flowrun/huey-best {rates['flowrun'][-1] / rates['huey best'][-1]:.2f}x"
            print(line, flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"[exec] medians of {args.repeat} (n {n}):")
    for k, v in med.items():
        if k == "setup/plain":
            continue
        unit = "/s"
        if k.endswith(" cpu"):
            unit = " us CPU a transition (/bin/true included, start-up too)"
        elif k.endswith((" daemon", " handlers")):
            unit = " us CPU a transition while running"
        print(f"  {k:>28}: {v:,.0f}{unit}")
    line = f"[exec] median ratios: flowrun/ceiling {med['flowrun'] / med['ceiling']:.2f}x"
    if DEFAULT in med:
        line += f", at the default {med[DEFAULT] / med['ceiling']:.2f}x"
    if "flowrun (setup)" in med:
        line += f", set-up/plain {med['flowrun (setup)'] / med['flowrun']:.2f}x (median of the "
        line += f"pairs' ratios {med['setup/plain']:.2f}x, pairs "
        line += ", ".join(f"{x:.2f}" for x in rates["setup/plain"])
        line += f"; CPU +{med['flowrun (setup) cpu'] - med['flowrun cpu']:,.0f} us a transition, "
        d_own = med["flowrun (setup) daemon"] - med["flowrun daemon"]
        d_handlers = med["flowrun (setup) handlers"] - med["flowrun handlers"]
        line += f"while running daemon {d_own:+,.0f} us, handlers {d_handlers:+,.0f} us)"
    if "flowrun (compare)" in med:
        line += f", flowrun/compared tree {med['flowrun'] / med['flowrun (compare)']:.2f}x"
    if "huey best" in med:
        line += f", flowrun/huey-best {med['flowrun'] / med['huey best']:.2f}x"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=None, help="10,000 (exec: 2,000)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--case", choices=["noop", "fail_once", "both", "exec"], default="both")
    ap.add_argument("--skip-huey", action="store_true")
    ap.add_argument(
        "--skip-default",
        action="store_true",
        help="run flowrun only at --concurrency, not also at the daemon's default",
    )
    ap.add_argument(
        "--compare",
        metavar="ROOT",
        help="exec case: also run the flowrun of this source tree (e.g. an export of an "
        "older commit), interleaved, for before/after figures from one run",
    )
    ap.add_argument(
        "--setup",
        action="store_true",
        help="exec case: also run the flow with env (5 names), a secret file and limits, "
        "interleaved, and print its ratio to the plain flow",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each side this many times, interleaved, and also print the medians "
        "(single runs on a 2-core machine vary by 10-20%%)",
    )
    ap.add_argument(
        "--huey-workers",
        type=int,
        default=2,
        help="huey consumer threads (default 2, the fixed peer configuration; huey's own consumer "
        "default is 1, which is faster on this 2-core machine)",
    )
    ap.add_argument(
        "--vs-args",
        help='compare flowrun against itself with these daemon options (e.g. "--metrics 0" '
        'or "--log-attempts"), interleaved, instead of against huey',
    )
    args = ap.parse_args()
    if args.case == "exec":
        main_exec(args)
        return
    args.n = args.n or 10_000
    if args.vs_args:
        compare_options(args)
        return
    cases = ["noop", "fail_once"] if args.case == "both" else [args.case]
    for case in cases:
        rates: dict[str, list[float]] = {"flowrun": [], DEFAULT: [], "default": [], "normal": []}
        for r in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="flowrun-bench-") as tmp:
                for key, conc in sides(args, r):
                    got = run_flowrun(args.n, conc, case, Path(tmp) / key.replace(" ", "-"))
                    rates[key].append(got["per_s"])
                    print(
                        f"[{case}] {key}: {got['transitions']} transitions ({got['attempts']} "
                        f"attempts) in {got['seconds']:.2f}s = {got['per_s']:,.0f} "
                        f"transitions/s (process wall {got['wall']:.2f}s, concurrency "
                        f"{conc or 'default'})"
                    )
                    if key == "flowrun":
                        fr = got
                if args.skip_huey:
                    continue
                for sync in ("default", "normal"):
                    hr = run_huey(args.n, sync, case, Path(tmp), args.huey_workers)
                    rates[sync].append(hr["per_s"])
                    print(
                        f"[{case}] huey {sync:>7}: {hr['tasks']} tasks in {hr['seconds']:.2f}s = "
                        f"{hr['per_s']:,.0f} tasks/s; ratio flowrun/huey = "
                        f"{fr['per_s'] / hr['per_s']:.2f}x"
                    )
        if args.repeat > 1 or rates[DEFAULT]:
            med = {k: statistics.median(v) for k, v in rates.items() if v}
            line = f"[{case}] median of {args.repeat}: flowrun {med['flowrun']:,.0f} transitions/s"
            if DEFAULT in med:
                line += (
                    f" (at the default {med[DEFAULT]:,.0f}/s, "
                    f"{med[DEFAULT] / med['flowrun']:.2f}x of --concurrency {args.concurrency})"
                )
            for sync in ("default", "normal"):
                if sync in med:
                    line += (
                        f"; huey {sync} {med[sync]:,.0f} tasks/s, "
                        f"ratio {med['flowrun'] / med[sync]:.2f}x"
                    )
            print(line)


def compare_options(args: argparse.Namespace) -> None:
    """flowrun plain vs flowrun with ``--vs-args``, interleaved; prints the medians and
    their ratio per case (an option such as ``--metrics`` may cost no case more than 5 %)."""
    extra = tuple(args.vs_args.split())
    cases = ["noop", "fail_once"] if args.case == "both" else [args.case]
    for case in cases:
        rates: dict[str, list[float]] = {"plain": [], "with": []}
        cpus: dict[str, list[float]] = {"plain": [], "with": []}
        for i in range(args.repeat):
            sides = [("plain", ()), ("with", extra)]
            for side, opts in sides if i % 2 == 0 else sides[::-1]:  # alternate the order
                with tempfile.TemporaryDirectory(prefix="flowrun-bench-") as tmp:
                    fr = run_flowrun(args.n, args.concurrency, case, Path(tmp), opts)
                rates[side].append(fr["per_s"])
                cpus[side].append(fr["cpu_us"])
                print(
                    f"[{case}] flowrun {' '.join(opts) or '(plain)'}: {fr['per_s']:,.0f}/s, "
                    f"{fr['cpu_us']:.0f} us CPU per transition (start-up included)"
                )
        plain, other = statistics.median(rates["plain"]), statistics.median(rates["with"])
        cpu_plain, cpu_other = statistics.median(cpus["plain"]), statistics.median(cpus["with"])
        print(
            f"[{case}] median of {args.repeat}: plain {plain:,.0f}/s, with {args.vs_args} "
            f"{other:,.0f}/s, ratio {other / plain:.3f}; CPU per transition plain "
            f"{cpu_plain:.0f} us, with {cpu_other:.0f} us, ratio {cpu_other / cpu_plain:.3f}"
        )


if __name__ == "__main__":
    main()
