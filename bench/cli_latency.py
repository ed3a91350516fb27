"""CLI start-up latency: each ``flowrun`` command next to ``python -c pass`` (not a test).

Every figure is the median wall time of real subprocesses of the installed ``flowrun``
console script (the one next to this interpreter), after one warm-up run, with the
``runner`` package's bytecode compiled first; ``python -c pass`` is measured in the same
run, interleaved, so the ratios hold on a shared, noisy machine.

Cases (goals from issue 12):

- ``flowrun --help`` (≤ 150 ms)
- ``flowrun ls --limit 50`` on a 10,000-instance SQLite database (≤ 300 ms); where ``ls``
  has no ``--limit`` the bench falls back to ``ls --status paused`` and says so
- the full ``flowrun ls`` and ``flowrun ls --json`` of those 10,000 (≤ 1 s each); slow
  cases stop after ``--budget`` seconds (at least 3 runs) and print how many they made
- ``flowrun check`` of the example folder ``flows/`` (≤ 400 ms)
- ``flowrun --daemon`` launch → first claim (≤ 400 ms): a fresh database holding one
  instance (created by ``flowrun start``, untimed), then the daemon is launched and the
  time runs until that instance's first attempt starts (its ``call`` handler writes
  ``time.time()`` to a file)

``--peer`` times another install (say the commit before a change, checked out with its
own venv) in the same interleaved rounds: before/after figures from one run.

Usage::

    .venv/bin/python bench/cli_latency.py [--runs 10] [--budget 60] [--instances 10000]
                                          [--skip-full] [--flows DIR]
                                          [--peer OTHER/.venv/bin/flowrun --peer-flows DIR]
"""

from __future__ import annotations

import argparse
import compileall
import os
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
    now = time.time()
    path = os.path.join(os.path.dirname(__file__), "started.txt")
    with open(path + ".tmp", "w") as f:
        f.write(repr(now))
    os.replace(path + ".tmp", path)
    return "done"
"""


def flowrun_script() -> str:
    """The ``flowrun`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "flowrun"
    if not script.exists():
        raise SystemExit(f"{script}: not found (pip install -e . in this venv first)")
    return str(script)


def compile_bytecode() -> None:
    """Compile the ``runner`` package (and this venv's site-packages) to bytecode."""
    import runner.errors  # noqa: F401 - locates the package directory

    package = Path(sys.modules["runner.errors"].__file__).parent
    compileall.compile_dir(str(package), quiet=1)
    for site in sys.path:
        if site.endswith("site-packages") and Path(site).is_dir():
            compileall.compile_dir(site, quiet=1)


def wall(argv: list[str], cwd: Path) -> float:
    """Seconds one run of ``argv`` takes (stdout discarded); raises if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr.decode()}")
    return elapsed


def measure(
    cases: dict[str, list[str]], cwd: Path, runs: int, budget: float
) -> dict[str, list[float]]:
    """Run every case ``runs`` times, interleaved (one round = one run of each), after a
    warm-up round; a case whose runs so far add up to more than ``budget`` seconds stops
    once it has 3. Returns seconds per run for each case."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for argv in cases.values():
        wall(argv, cwd)  # warm-up: page cache, bytecode, the database's first open
    for _ in range(runs):
        for name, argv in cases.items():
            if len(times[name]) >= 3 and sum(times[name]) > budget:
                continue
            times[name].append(wall(argv, cwd))
    return times


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


def daemon_first_claim(flowrun: str, tmp: Path, runs: int) -> list[float]:
    """Seconds from launching ``flowrun --daemon`` to its first attempt's start, once per
    run, each on a fresh database holding one instance (folders made under ``tmp``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    out: list[float] = []
    for i in range(runs + 1):  # the first run is a warm-up
        flows = tmp / f"daemon{i}"
        flows.mkdir()
        (flows / "blink.yaml").write_text(FLOW)
        (flows / "blink_handler.py").write_text(HANDLER)
        started = flows / "started.txt"
        base = [flowrun, "--flows", str(flows), "--db", f"sqlite:///{flows / 'blink.db'}"]
        wall([*base, "start", "blink"], tmp)
        with open(flows / "daemon.log", "w") as log:
            t0 = time.time()
            daemon = subprocess.Popen(
                [*base, "--daemon", "--worker-id", "blink"],
                cwd=tmp,
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
                first = float(started.read_text())
            finally:
                stop(daemon)
        if i:
            out.append(first - t0)
    return out


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
    ap.add_argument("--flows", type=Path, default=ROOT / "flows", help="folder `check` reads")
    ap.add_argument(
        "--peer",
        help="another install's flowrun script (e.g. an older commit in its own venv), "
        "timed in the same interleaved rounds; its rows are marked [peer]",
    )
    ap.add_argument("--peer-flows", type=Path, help="folder the peer's `check` reads")
    args = ap.parse_args(argv)
    flowrun = flowrun_script()
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="flowrun-cli-bench-") as tmpdir:
        tmp = Path(tmpdir)
        populate_db(flowrun, tmp / "ls.db", args.instances)
        full = not args.skip_full
        cases = {"python -c pass": [sys.executable, "-c", "pass"]}
        cases.update(cases_for(flowrun, ["--db", f"sqlite:///{tmp}/ls.db"], args.flows, full, ""))
        if args.peer:
            populate_db(args.peer, tmp / "peer.db", args.instances)
            url = ["--db", f"sqlite:///{tmp}/peer.db"]
            peer_flows = args.peer_flows or args.flows
            cases.update(cases_for(args.peer, url, peer_flows, full, " [peer]"))
        times = measure(cases, tmp, args.runs, args.budget)
        times["--daemon → first claim"] = daemon_first_claim(flowrun, tmp / "this", args.runs)
        if args.peer:
            key = "--daemon → first claim [peer]"
            times[key] = daemon_first_claim(args.peer, tmp / "peer", args.runs)
    base = statistics.median(times["python -c pass"])
    print(
        f"{flowrun}{f' (peer: {args.peer})' if args.peer else ''}: medians in ms, "
        f"{args.instances:,} instances, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'case':<33}{'median':>9}{'runs':>6}{'× pass':>9}{'- pass':>9}{'goal':>7}")
    for name, values in sorted(times.items(), key=lambda kv: kv[0].endswith("[peer]")):
        med = statistics.median(values) * 1000
        goal = GOALS.get(name)
        print(
            f"{name:<33}{med:9.1f}{len(values):6d}{med / (base * 1000):9.2f}"
            f"{med - base * 1000:9.1f}{goal if goal else '':>7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
