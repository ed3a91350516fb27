"""A daemon's no-op throughput over a whole prune, against none (not a test; issue 27).

Issue 27 asks that pruning 1,000,000 instances while a daemon runs new work leaves the
daemon ≥ 0.8× its throughput. ``bench/scale.py``'s drain of ``--new`` instances covers
only the first seconds of such a prune; this one covers all of it.

On a copy of a database built by ``bench/scale.py --build-only --keep DIR`` (``--from
DIR``; SQLite or PostgreSQL, as built), one daemon (``--concurrency 64``, pruner off) runs
flat out on a three-state no-op flow. A feeder keeps its backlog between ``--backlog``
and twice that (``--chunk`` instances a transaction, checked every 0.2 s), so the daemon
never waits for work. Three phases on the same daemon:

- ``before``: ``--seconds`` with nothing else running;
- ``prune``: ``flowrun prune --flow hist --older-than 1s`` deletes the history
  (instances, attempts, events' links) meanwhile; the phase lasts until it exits;
- ``after``: ``--seconds`` again, on the pruned database.

A phase's **throughput** is the no-op attempts that finished inside it, per second,
counted afterwards from the attempt rows flowrun wrote (``finished_at``). The ratio is
``prune / before``; ``after`` shows how much of a difference is the table's size.

    python bench/prune_throughput.py --from DIR [--seconds 60] [--backlog 20000]
                                     [--chunk 2000] [--concurrency 64] [--keep DIR2]
                                     [--prune-for S]

``--prune-for S`` measures only the first S seconds of the prune (then interrupted; the
rows it deleted are counted): on a shared machine a prune of 1,000,000 instances under
full load takes most of an hour.

Prints one JSON object. The machine's load average is recorded with each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import scale  # noqa: E402

NOOP3 = """\
flow: noop
initial: s1
states:
  s1: {call: "scale_tasks:noop", next: s2}
  s2: {call: "scale_tasks:noop", next: s3}
  s3: {call: "scale_tasks:noop", next: done}
  done: {terminal: true}
"""


class Feeder(threading.Thread):
    """Keeps between ``backlog`` and ``2 * backlog`` ``noop`` instances not yet
    finished, ``chunk`` a transaction, until :meth:`stop`."""

    def __init__(self, url: str, flows: Path, backlog: int, chunk: int) -> None:
        super().__init__(daemon=True)
        self.url, self.flows, self.backlog, self.chunk = url, flows, backlog, chunk
        self.made = 0
        self._quit = threading.Event()

    def stop(self) -> None:
        self._quit.set()
        self.join()

    def run(self) -> None:
        from sqlalchemy import func, select

        from runner.flowspec.compiler import load_flow
        from runner.store.create import create_instances
        from runner.store.db import make_engine
        from runner.store.tables import instances

        engine = make_engine(self.url)
        flow = load_flow(self.flows / "noop.yaml")
        waiting = select(func.count()).where(
            instances.c.flow == "noop", instances.c.status == "runnable"
        )
        while not self._quit.is_set():
            with engine.connect() as conn:
                n = conn.execute(waiting).scalar_one()
            while n < 2 * self.backlog and not self._quit.is_set():
                with engine.begin() as conn:
                    self.made += create_instances(conn, flow, [{}] * self.chunk)
                n += self.chunk
            self._quit.wait(0.2)
        engine.dispose()


def finished_between(url: str, first_id: int, windows: dict[str, tuple[float, float]]) -> dict:
    """Per phase: no-op attempts of instances ``>= first_id`` that finished inside its
    ``(start, end)`` (epoch seconds), and that count per second."""
    from sqlalchemy import func, select

    from runner.store.db import make_engine
    from runner.store.tables import attempts

    engine = make_engine(url)
    out = {}
    with engine.connect() as conn:
        for name, (lo, hi) in windows.items():
            n = conn.execute(
                select(func.count()).where(
                    attempts.c.instance_id >= first_id,
                    attempts.c.finished_at >= lo,
                    attempts.c.finished_at < hi,
                )
            ).scalar_one()
            out[name] = {"attempts": n, "s": round(hi - lo, 1), "per_s": round(n / (hi - lo), 1)}
    engine.dispose()
    return out


def hist_left(url: str) -> int:
    """The history's instances still in the database."""
    from sqlalchemy import func, select

    from runner.store.db import make_engine
    from runner.store.tables import instances

    engine = make_engine(url)
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).where(instances.c.flow == "hist")).scalar_one()
    engine.dispose()
    return n


def run(a: argparse.Namespace, work: Path) -> dict:
    a.built = json.loads((a.source / "big" / scale.BUILT).read_text())
    a.db = a.built["db"]
    url, flows = scale.copy_big(a, work)
    home = flows.parent
    (flows / "noop.yaml").write_text(NOOP3)
    report: dict = {"db": a.db, "size": a.built["size"], "rows": scale.counts(url)}
    from sqlalchemy import func, select

    from runner.store.db import make_engine
    from runner.store.tables import instances

    engine = make_engine(url)
    with engine.connect() as conn:
        first_id = conn.execute(select(func.max(instances.c.id))).scalar_one() + 1
    engine.dispose()
    with scale.autovacuum_on(url) as autovacuum:
        if autovacuum is not None:
            report["autovacuum"] = autovacuum
        return _phases(a, url, flows, home, first_id, report)


def _phases(
    a: argparse.Namespace, url: str, flows: Path, home: Path, first_id: int, report: dict
) -> dict:
    """The three phases on one daemon (see the module docstring); fills ``report``."""
    feeder = Feeder(url, flows, a.backlog, a.chunk)
    feeder.start()
    env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    argv = [sys.executable, "-m", "runner.cli", "--daemon", "--prune-every", "0"]
    argv += ["--concurrency", str(a.concurrency)]
    daemon = subprocess.Popen(argv, env=env, cwd=home, stderr=subprocess.DEVNULL)
    windows: dict[str, tuple[float, float]] = {}
    loads = {}
    try:
        time.sleep(5)  # start-up, first claims
        t = time.time()
        time.sleep(a.seconds)
        windows["before"] = (t, time.time())
        loads["before"] = scale.loadavg()
        prune = [sys.executable, "-m", "runner.cli", "prune", "--flow", "hist"]
        prune += ["--older-than", "1s", "--json"]
        held = hist_left(url)
        t = time.time()
        proc = subprocess.Popen(prune, env=env, cwd=home, stdout=subprocess.PIPE, text=True)
        try:
            out, _ = proc.communicate(timeout=a.prune_for)
            report["pruned"] = {k: json.loads(out)[k] for k in ("instances", "attempts")}
        except subprocess.TimeoutExpired:  # the first --prune-for seconds of the prune
            proc.send_signal(signal.SIGINT)
            proc.communicate()
            report["pruned"] = {"instances": held - hist_left(url), "cut_at_s": a.prune_for}
        windows["prune"] = (t, time.time())
        loads["prune"] = scale.loadavg()
        t = time.time()
        time.sleep(a.seconds)
        windows["after"] = (t, time.time())
        loads["after"] = scale.loadavg()
    finally:
        feeder.stop()
        daemon.send_signal(signal.SIGINT)
        daemon.wait(120)
    phases = finished_between(url, first_id, windows)
    for name, load in loads.items():
        phases[name]["loadavg"] = load
    report["phases"] = phases
    report["made"] = feeder.made
    report["prune_vs_before"] = round(phases["prune"]["per_s"] / phases["before"]["per_s"], 3)
    report["prune_vs_after"] = round(phases["prune"]["per_s"] / phases["after"]["per_s"], 3)
    report["bytes_at_end"] = scale.size_of(url)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="source", type=Path, required=True, metavar="DIR")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of before and after")
    ap.add_argument(
        "--prune-for",
        type=float,
        default=None,
        metavar="S",
        help="end the prune phase after S seconds (the prune is interrupted)",
    )
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--chunk", type=int, default=2_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="flowrun-prune-throughput-"))
    try:
        print(json.dumps(run(a, work), indent=2))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
            for name in scale.MADE:
                scale._admin(a.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
