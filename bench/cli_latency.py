"""CLI start-up latency: each ``flowrun`` command next to ``python -c pass`` (not a test).

Every figure is the median wall time of real subprocesses of the installed ``flowrun``
console script (the one next to this interpreter), after one warm-up run, with the
``runner`` package's bytecode compiled first (each install's, by its own interpreter);
``python -c pass`` is measured in the same run, interleaved, so the ratios hold on a
shared, noisy machine.

Cases (with their goals, as ``docs/performance.md`` lists them):

- ``flowrun --help`` (≤ 150 ms)
- ``flowrun ls --limit 50`` on a 10,000-instance SQLite database (≤ 300 ms); where ``ls``
  has no ``--limit`` the bench falls back to ``ls --status paused`` and says so
- the full ``flowrun ls`` and ``flowrun ls --json`` of those 10,000 (≤ 1 s each); slow
  cases stop after ``--budget`` seconds (at least 3 runs) and print how many they made
- ``flowrun check`` of the example folder ``flows/`` (≤ 400 ms)
- ``flowrun --daemon`` launch → first claim (≤ 400 ms): a fresh database holding one
  instance (created by ``flowrun start``, untimed), then the daemon is launched and the
  time runs until that instance's first attempt starts (its ``call`` handler writes
  ``time.time()`` to a file, and ``time.process_time()``: the CPU column is then the
  daemon's own CPU time by then, less sensitive to a loaded machine than the wall time)

``--floor`` adds two lower bounds for the daemon's first claim, interpreters that only
import the libraries it cannot start without: ``floor: libraries`` (asyncio, click,
logging, sqlite3, SQLAlchemy with its SQLite dialect, ruamel.yaml, transitions, and
pydantic with one model built), and ``floor: + sqlmodel`` (the same and ``sqlmodel``,
which brings SQLAlchemy's ORM), with the garbage collector off as in the daemon.

``--peer`` times another install (say the commit before a change, checked out with its
own venv) in the same interleaved rounds (the daemon launches too, alternating which
goes first): before/after figures from one run.

Usage::

    .venv/bin/python bench/cli_latency.py [--runs 10] [--budget 60] [--instances 10000]
                                          [--skip-full] [--floor] [--flows DIR]
                                          [--peer OTHER/.venv/bin/flowrun --peer-flows DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from latency import stop  # noqa: E402 - bench/ is on the path only now

FLOW = """\
flow: blink
initial: run
states:
  run:
    call: blink_handler:run
    to: [done]
  done: {terminal: true}
"""

HANDLER = """\
import os
import time


def run(ctx):
    now, cpu = time.time(), time.process_time()
    path = os.path.join(os.path.dirname(__file__), "started.txt")
    with open(path + ".tmp", "w") as f:
        f.write(f"{now!r} {cpu!r}")
    os.replace(path + ".tmp", path)
    return "done"
"""


def flowrun_script() -> str:
    """The ``flowrun`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "flowrun"
    if not script.exists():
        raise SystemExit(f"{script}: not found (pip install -e . in this venv first)")
    return str(script)


COMPILE = """
import compileall, sys
from pathlib import Path
import runner.errors  # locates the package directory
compileall.compile_dir(str(Path(runner.errors.__file__).parent), quiet=1)
for site in sys.path:
    if site.endswith("site-packages") and Path(site).is_dir():
        compileall.compile_dir(site, quiet=1)
"""


def compile_bytecode(flowrun: str) -> None:
    """Compile the ``runner`` package of ``flowrun``'s install (and its venv's
    site-packages) to bytecode, by that install's interpreter: with
    ``PYTHONDONTWRITEBYTECODE`` set, a package never compiled is compiled again by every
    run (a peer checked out by ``git archive`` was ~70 ms slower to its first claim)."""
    python = str(Path(flowrun).parent / "python")
    subprocess.run([python, "-c", COMPILE], cwd=Path(flowrun).parent, check=True)


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Seconds one run of ``argv`` takes (stdout discarded) and the CPU seconds it used;
    raises if it fails."""
    c0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed, cpu = time.perf_counter() - t0, children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr.decode()}")
    return elapsed, cpu


def measure(
    cases: dict[str, list[str]], cwd: Path, runs: int, budget: float
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every case ``runs`` times, interleaved (one round = one run of each), after a
    warm-up round; a case whose runs so far add up to more than ``budget`` seconds stops
    once it has 3. Returns the seconds per run of each case, and the CPU seconds."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for argv in cases.values():
        wall(argv, cwd)  # warm-up: page cache, bytecode, the database's first open
    for _ in range(runs):
        for name, argv in cases.items():
            if len(times[name]) >= 3 and sum(times[name]) > budget:
                continue
            seconds, cpu = wall(argv, cwd)
            times[name].append(seconds)
            cpus[name].append(cpu)
    return times, cpus


POPULATE = """
import sys
sys.path.insert(0, sys.argv[1])
from console import populate
from runner.store.db import make_engine
engine = make_engine("sqlite:///" + sys.argv[2])
populate(engine, int(sys.argv[3]), attempts_per=0)  # its attempts break attempts_unique
engine.dispose()
"""


def populate_db(flowrun: str, path: Path, n: int) -> None:
    """A SQLite database with ``n`` instances (``bench/console.py``'s generator), made by
    the install of ``flowrun`` (its own interpreter, checkout and schema revision: the
    checkout is the folder holding ``.venv/bin/flowrun``)."""
    python = str(Path(flowrun).parent / "python")
    bench = Path(flowrun).resolve().parents[2] / "bench"
    bench = bench if (bench / "console.py").exists() else HERE
    argv = [python, "-c", POPULATE, str(bench), str(path), str(n)]
    subprocess.run(argv, cwd=bench.parent, check=True)  # not this checkout's runner


def first_claim(flowrun: str, flows: Path, cwd: Path) -> tuple[float, float]:
    """One launch of ``flowrun --daemon`` on a fresh database in ``flows`` (made here)
    holding one instance: returns (seconds from launch to the first attempt's start, the
    daemon's CPU seconds by then, from its handler's ``time.process_time()``)."""
    flows.mkdir(parents=True)
    (flows / "blink.yaml").write_text(FLOW)
    (flows / "blink_handler.py").write_text(HANDLER)
    started = flows / "started.txt"
    base = [flowrun, "--flows", str(flows), "--db", f"sqlite:///{flows / 'blink.db'}"]
    wall([*base, "start", "blink"], cwd)  # untimed
    with open(flows / "daemon.log", "w") as log:
        t0 = time.time()
        daemon = subprocess.Popen(
            [*base, "--daemon", "--worker-id", "blink"],
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while not started.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        "the daemon did not start the attempt; log:\n"
                        + (flows / "daemon.log").read_text()[-3000:]
                    )
                time.sleep(0.002)
            first, cpu = (float(x) for x in started.read_text().split())
        finally:
            stop(daemon)
    return first - t0, cpu


def daemon_first_claim(
    installs: dict[str, str], tmp: Path, runs: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``first_claim`` of each install (name → ``flowrun`` script) ``runs`` times, after
    one warm-up each, interleaved: one launch of each per round, the order flipping every
    round. Returns, per name, the seconds to the first claim, and the daemon's CPU
    seconds by then."""
    times: dict[str, list[float]] = {name: [] for name in installs}
    cpus: dict[str, list[float]] = {name: [] for name in installs}
    names = list(installs)
    for i in range(runs + 1):  # round 0 is a warm-up
        for name in names if i % 2 else names[::-1]:
            seconds, cpu = first_claim(installs[name], tmp / f"{name}-{i}", tmp)
            if i:
                times[name].append(seconds)
                cpus[name].append(cpu)
    return times, cpus


FLOOR = (
    "import gc\n"
    "gc.disable()\n"  # as the daemon starts (``runner.cli.main.run_daemon``)
    "import asyncio, click, logging, sqlite3, sqlalchemy, sqlalchemy.dialects.sqlite, "
    "ruamel.yaml, transitions\n"
    "from pydantic import BaseModel\n"
    "class M(BaseModel):\n"
    "    x: int\n"
)

#: Ends a floor without the interpreter's teardown (the daemon's figures stop at its first
#: claim, long before its own).
EXIT = "import os\nos._exit(0)\n"


def floor_cases() -> dict[str, list[str]]:
    """The ``--floor`` cases: the first claim's libraries, without and with sqlmodel."""
    return {
        "floor: libraries": [sys.executable, "-c", FLOOR + EXIT],
        "floor: + sqlmodel": [sys.executable, "-c", FLOOR + "import sqlmodel\n" + EXIT],
    }


def cases_for(flowrun: str, url: list[str], flows: Path, full: bool, tag: str) -> dict:
    """The commands to time for one install (``tag`` marks a peer's rows), and notes."""
    ls_help = subprocess.run([flowrun, "ls", "--help"], capture_output=True, text=True)
    if "--limit" in ls_help.stdout:
        cases = {"ls --limit 50": [flowrun, *url, "ls", "--limit", "50"]}
    else:
        print(f"note: {flowrun}: ls has no --limit: `ls --status paused` instead")
        cases = {"ls --status paused": [flowrun, *url, "ls", "--status", "paused"]}
    cases = {
        "flowrun --help": [flowrun, "--help"],
        **cases,
        "check flows/": [flowrun, "--flows", str(flows), "check"],
    }
    if full:
        cases["ls (all)"] = [flowrun, *url, "ls"]
        cases["ls --json (all)"] = [flowrun, *url, "ls", "--json"]
    return {f"{name}{tag}": argv for name, argv in cases.items()}


GOALS = {
    "flowrun --help": 150,
    "ls --limit 50": 300,
    "check flows/": 400,
    "ls (all)": 1000,
    "ls --json (all)": 1000,
    "--daemon → first claim": 400,
}


def main(argv: list[str] | None = None) -> int:
    """Build the database, run every case, print medians next to ``python -c pass``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per case (median)")
    ap.add_argument(
        "--budget", type=float, default=60.0, help="seconds a slow case may take (≥ 3 runs)"
    )
    ap.add_argument("--instances", type=int, default=10_000)
    ap.add_argument("--skip-full", action="store_true", help="skip the full ls / ls --json")
    ap.add_argument(
        "--floor", action="store_true", help="time the first claim's libraries' imports"
    )
    ap.add_argument("--flows", type=Path, default=ROOT / "flows", help="folder `check` reads")
    ap.add_argument(
        "--peer",
        help="another install's flowrun script (e.g. an older commit in its own venv), "
        "timed in the same interleaved rounds; its rows are marked [peer]",
    )
    ap.add_argument("--peer-flows", type=Path, help="folder the peer's `check` reads")
    args = ap.parse_args(argv)
    flowrun = flowrun_script()
    compile_bytecode(flowrun)
    if args.peer:
        compile_bytecode(args.peer)
    with tempfile.TemporaryDirectory(prefix="flowrun-cli-bench-") as tmpdir:
        tmp = Path(tmpdir)
        populate_db(flowrun, tmp / "ls.db", args.instances)
        full = not args.skip_full
        cases = {"python -c pass": [sys.executable, "-c", "pass"]}
        if args.floor:
            cases.update(floor_cases())
        cases.update(cases_for(flowrun, ["--db", f"sqlite:///{tmp}/ls.db"], args.flows, full, ""))
        if args.peer:
            populate_db(args.peer, tmp / "peer.db", args.instances)
            url = ["--db", f"sqlite:///{tmp}/peer.db"]
            peer_flows = args.peer_flows or args.flows
            cases.update(cases_for(args.peer, url, peer_flows, full, " [peer]"))
        times, cpus = measure(cases, tmp, args.runs, args.budget)
        installs = {"--daemon → first claim": flowrun}
        if args.peer:
            installs["--daemon → first claim [peer]"] = args.peer
        daemon_times, daemon_cpus = daemon_first_claim(installs, tmp / "daemon", args.runs)
        times.update(daemon_times)
        cpus.update(daemon_cpus)
    base = statistics.median(times["python -c pass"])
    print(
        f"{flowrun}{f' (peer: {args.peer})' if args.peer else ''}: medians in ms, "
        f"{args.instances:,} instances, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("CPU: the process's own user + system time (the daemon's: by its first claim)")
    print(f"{'case':<33}{'median':>9}{'runs':>6}{'× pass':>9}{'- pass':>9}{'CPU':>8}{'goal':>7}")
    for name, values in sorted(times.items(), key=lambda kv: kv[0].endswith("[peer]")):
        med = statistics.median(values) * 1000
        cpu = statistics.median(cpus[name]) * 1000
        goal = GOALS.get(name)
        print(
            f"{name:<33}{med:9.1f}{len(values):6d}{med / (base * 1000):9.2f}"
            f"{med - base * 1000:9.1f}{cpu:8.1f}{goal if goal else '':>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
