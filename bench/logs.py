"""Attempt logs: what capturing every attempt's output costs (issue 29; not a test).

In one run, on SQLite and (``--pg URL``) PostgreSQL:

1. ``exec`` handlers that print nothing (``/bin/true``), with capture as built against
   capture off (``FLOWRUN_LOG_CAPTURE=off``), interleaved ``--repeat`` times: attempts/s
   of each and their ratio (goal >= 0.97);
2. handlers that print 4 KiB each: attempts/s and the ratio to the no-output rate
   (goal >= 0.9);
3. one handler writing 100 MB: the daemon's wall time against ``cat > /dev/null`` of the
   same bytes, and the daemon's peak RSS (``ru_maxrss``) with capture on and off;
4. ``flowrun logs -f`` latency: a handler prints its clock every 50 ms for 3 s; the
   follower's receive time minus it, p50/p99 (goal p99 <= 500 ms), over the lines printed
   once it showed its first (not the backlog it started with); and how long after a
   silent attempt (``sleep 2``) ended a follower of it exits;
5. the loop under load: 20 handlers writing at full speed for the whole measure while
   ``--starts`` (200) ``/bin/true`` instances are created one every 50 ms; their start
   latency (attempt started - instance created) p50/p99 against the same with no noisy
   handler (goal p99 under 2x idle);
6. the console (SQLite only): a 10.5 MB log (105,000 lines) opened by the log screen
   (goal <= 1 s) and one frame of it, scrolled and rendered (goal <= 25 ms).

A rate is attempts / (last attempt finished - first started), read from the attempts
table, of one ``flowrun --daemon --exit-when-idle`` draining N instances.

    python bench/logs.py [--n 1000] [--repeat 3] [--pg postgresql+psycopg://...]
        [--parts quiet,print,big,follow,console,latency] [--starts 200]
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

FLOW = """\
flow: {name}
initial: s1
defaults: {{try_interval: 1s}}
states:
  s1: {{exec: {argv}, next: done}}
  done: {{terminal: true}}
"""

PRINT_4K = "import sys; sys.stdout.write('x' * 4095 + '\\n')"
BIG = """\
import sys
b = b'y' * 65535 + b'\\n'
for _ in range(1526):
    sys.stdout.buffer.write(b)
"""
TICKS = """\
import time
for _ in range(60):
    print(repr(time.time()), flush=True)
    time.sleep(0.05)
"""


def _flowrun(db: str, flows: Path, *args: str, env: dict | None = None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", db, *args],
        env=env or _env(),
        capture_output=True,
        text=True,
        check=False,
        **kw,
    )


def _env(capture: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env["PYTHONPATH"] = str(ROOT)
    if not capture:
        env["FLOWRUN_LOG_CAPTURE"] = "off"
    return env


def _world(db: str, tmp: Path, argv: list[str], n: int) -> tuple[Path, str]:
    name = f"b{uuid.uuid4().hex[:8]}"
    flows = tmp / name
    flows.mkdir()
    (flows / f"{name}.yaml").write_text(FLOW.format(name=name, argv=argv))
    (flows / "big.py").write_text(BIG)
    (flows / "ticks.py").write_text(TICKS)
    engine = _engine(db)
    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances

    flow = load_flow(flows / f"{name}.yaml")
    with engine.begin() as conn:
        create_instances(conn, flow, [{} for _ in range(n)])
    return flows, name


_engines: dict = {}


def _engine(db: str):
    if db not in _engines:
        from runner.store.db import make_engine

        _engines[db] = make_engine(db)
    return _engines[db]


def _drain(db: str, flows: Path, capture: bool) -> tuple[float, int]:
    """Run one daemon until idle: ``(wall seconds, peak RSS in KiB)``."""
    argv = [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", db]
    argv += ["--daemon", "--exit-when-idle", "--prune-every", "0"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=_env(capture), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"daemon failed: {proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss


def _rate(db: str, flow: str) -> float:
    from sqlalchemy import text

    with _engine(db).connect() as conn:
        n, first, last = conn.execute(
            text(
                "SELECT count(*), min(a.started_at), max(a.finished_at) FROM attempts a "
                "JOIN instances i ON i.id = a.instance_id WHERE i.flow = :f"
            ),
            {"f": flow},
        ).one()
    return n / (last - first)


def _rates(db: str, tmp: Path, argv: list[str], n: int, capture: bool) -> float:
    flows, name = _world(db, tmp, argv, n)
    _drain(db, flows, capture)
    return _rate(db, name)


def _follow(db: str, tmp: Path) -> list[float]:
    flows, _name = _world(db, tmp, ["python", "ticks.py"], 1)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", db, "--daemon",
         "--exit-when-idle", "--prune-every", "0"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    from sqlalchemy import text

    with _engine(db).connect() as conn:
        iid = conn.execute(text("SELECT max(id) FROM instances")).scalar()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with _engine(db).connect() as conn:
            q = "SELECT count(*) FROM attempt_logs WHERE instance_id = :i"
            if conn.execute(text(q), {"i": iid}).scalar():
                break
        time.sleep(0.05)
    follower = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "--db", db, "logs", str(iid), "-f"],
        env=_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    lags = []
    up = None  # when the follower showed its first line: it is following from then on
    for line in follower.stdout:
        now = time.time()
        up = up or now
        try:
            printed = float(line)
        except ValueError:
            continue
        if printed > up:  # printed while it followed (not the backlog it started with)
            lags.append(now - printed)
    follower.wait()
    daemon.wait()
    return lags


def _silent_end(db: str, tmp: Path) -> float:
    """Seconds from a silent attempt's end (its ``finished_at``) to the exit of a
    ``logs -f`` following it."""
    from sqlalchemy import text

    flows, _name = _world(db, tmp, ["sleep", "2"], 1)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "--flows", str(flows), "--db", db, "--daemon",
         "--exit-when-idle", "--prune-every", "0"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    with _engine(db).connect() as conn:
        iid = conn.execute(text("SELECT max(id) FROM instances")).scalar()
    q = "SELECT running_attempt FROM instances WHERE id = :i"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with _engine(db).connect() as conn:
            if conn.execute(text(q), {"i": iid}).scalar():
                break
        time.sleep(0.02)
    follower = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--db", db, "logs", str(iid), "-f"],
        env=_env(), capture_output=True, check=False,
    )  # fmt: skip
    ended = time.time()
    daemon.wait()
    with _engine(db).connect() as conn:
        q = "SELECT max(finished_at) FROM attempts WHERE instance_id = :i"
        finished = conn.execute(text(q), {"i": iid}).scalar()
    return ended - float(finished) if follower.returncode == 0 and finished else float("nan")


NOISY = """\
import sys, time
end = time.time() + {secs}
b = b'z' * 65535 + b'\\n'
while time.time() < end:
    sys.stdout.buffer.write(b)
"""


def _start_latency(db: str, tmp: Path, noisy: int, starts: int) -> list[float]:
    """Start latencies (seconds) of ``starts`` quick instances created one every 50 ms
    while ``noisy`` handlers write at full speed (for the whole measure)."""
    secs = starts * 0.05 + 4.0
    from sqlalchemy import text

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instance, create_instances

    quick, qname = _world(db, tmp, ["/bin/true"], 0)
    (quick / "noisy.py").write_text(NOISY.format(secs=secs))
    (quick / "noisy.yaml").write_text(FLOW.format(name=f"{qname}n", argv=["python", "noisy.py"]))
    engine = _engine(db)
    qflow = load_flow(quick / f"{qname}.yaml")
    nflow = load_flow(quick / "noisy.yaml")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "runner.cli", "--flows", str(quick), "--db", db, "--daemon",
         "--prune-every", "0"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(2.0)  # the daemon's start-up
        if noisy:
            with engine.begin() as conn:
                create_instances(conn, nflow, [{} for _ in range(noisy)])
            time.sleep(1.0)
        ids = []
        for _ in range(starts):
            with engine.begin() as conn:
                ids.append(create_instance(conn, qflow, {}))
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                rows = (
                    conn.execute(
                        text(
                            "SELECT a.started_at - i.created_at FROM attempts a JOIN instances i "
                            "ON i.id = a.instance_id WHERE i.flow = :f"
                        ),
                        {"f": qname},
                    )
                    .scalars()
                    .all()
                )
            if len(rows) >= len(ids):
                return list(rows)
            time.sleep(0.2)
        return list(rows)
    finally:
        daemon.terminate()
        daemon.wait()


def _console(tmp: Path) -> tuple[float, float, float]:
    """``(seconds to open, frame p50, frame max)`` of the log screen on a 10.5 MB log."""
    import asyncio

    from sqlalchemy import insert, text
    from textual.geometry import Region

    from runner.store.tables import attempt_logs
    from runner.tui.app import FlowrunApp
    from runner.tui.screens.logs import LogScreen, LogView

    db = f"sqlite:///{tmp / 'console.db'}"
    flows, _name = _world(db, tmp, ["/bin/true"], 1)
    engine = _engine(db)
    with engine.connect() as conn:
        iid = conn.execute(text("SELECT max(id) FROM instances")).scalar()
    piece = (b"x" * 99 + b"\n") * 640
    rows = [
        {"instance_id": iid, "attempt": 1, "seq": k + 1, "stream": 1 + k % 2, "at": 0.0,
         "offset": k * len(piece), "data": piece}
        for k in range(164)
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(attempt_logs), rows)

    async def run() -> tuple[float, float, float]:
        app = FlowrunApp(engine, flows_dir=flows, live=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            t0 = time.perf_counter()
            app.push_screen(LogScreen(iid, 1))
            while not (
                isinstance(app.screen, LogScreen)
                and app.screen.query(LogView)
                and app.screen.query_one(LogView)._rows
            ):
                await pilot.pause(0.005)
            opened = time.perf_counter() - t0
            view = app.screen.query_one(LogView)
            frames = []
            for k in range(50):
                t = time.perf_counter()
                view.scroll_to(y=k * 2000, animate=False)
                view.render_lines(Region(0, 0, view.size.width, view.size.height))
                frames.append(time.perf_counter() - t)
            frames.sort()
            return opened, frames[25], frames[-1]

    return asyncio.run(run())


def _cat(nbytes: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(f"head -c {nbytes} /dev/zero | cat > /dev/null", shell=True, check=True)
    return time.perf_counter() - t0


PARTS = ("quiet", "print", "big", "follow", "console", "latency")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pg", help="a PostgreSQL URL too (a fresh database is best)")
    ap.add_argument(
        "--starts", type=int, default=200,
        help="quick instances a start-latency phase creates (p99 of 40 would be the worst one)",
    )  # fmt: skip
    ap.add_argument("--parts", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        dbs = [("sqlite", f"sqlite:///{tmp / 'bench.db'}")]
        if args.pg:
            dbs.append(("postgresql", args.pg))
        for label, db in dbs:
            on, off, four = [], [], []
            for i in range(args.repeat if "quiet" in parts else 0):
                # in turn first: the database grows by --n instances a run
                for capture in (False, True) if i % 2 == 0 else (True, False):
                    (on if capture else off).append(_rates(db, tmp, ["/bin/true"], args.n, capture))
            for _ in range(args.repeat if "print" in parts else 0):
                four.append(_rates(db, tmp, ["python", "-c", PRINT_4K], args.n // 4, True))
            if on:
                m_on, m_off = statistics.median(on), statistics.median(off)
                print(f"[{label}] no output: capture on {m_on:.0f}/s, off {m_off:.0f}/s, "
                      f"ratio {m_on / m_off:.3f} (goal >= 0.97); runs on "
                      f"{[round(x) for x in on]} off {[round(x) for x in off]}")  # fmt: skip
            if four:
                # the 4 KiB handler is a python process: compare with python printing nothing
                quiet = [_rates(db, tmp, ["python", "-c", "pass"], args.n // 4, True)
                         for _ in range(args.repeat)]  # fmt: skip
                m4, mq = statistics.median(four), statistics.median(quiet)
                print(f"[{label}] 4 KiB each (python -c): {m4:.1f}/s vs printing nothing "
                      f"{mq:.1f}/s, ratio {m4 / mq:.3f} (goal >= 0.9)")  # fmt: skip
            if "big" in parts:
                nbytes = 1526 * 65536
                results = {}
                for capture in (True, False):
                    flows, _ = _world(db, tmp, ["python", "big.py"], 1)
                    results[capture] = _drain(db, flows, capture)
                cat = _cat(nbytes)
                (w_on, rss_on), (w_off, rss_off) = results[True], results[False]
                print(f"[{label}] 100 MB handler: daemon wall {w_on:.2f}s capture on, "
                      f"{w_off:.2f}s off; cat > /dev/null {cat:.2f}s; peak RSS "
                      f"{rss_on / 1024:.0f} MiB on, {rss_off / 1024:.0f} MiB off")  # fmt: skip
            lags = sorted(_follow(db, tmp)) if "follow" in parts else []
            if lags:
                p50 = lags[len(lags) // 2] * 1000
                p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1000
                print(f"[{label}] logs -f latency over {len(lags)} lines: p50 {p50:.0f} ms, "
                      f"p99 {p99:.0f} ms (goal p99 <= 500 ms)")  # fmt: skip
            if "follow" in parts:
                late = sorted(_silent_end(db, tmp) for _ in range(3))
                runs = [round(x * 1000) for x in late]
                print(f"[{label}] logs -f of a silent attempt exits {late[1] * 1000:.0f} ms "
                      f"after it ended (median of 3; runs {runs})")  # fmt: skip
            if label == "sqlite" and "console" in parts:
                opened, p50, worst = _console(tmp)
                print(f"[console] 10.5 MB log opened in {opened * 1000:.0f} ms (goal <= 1 s); "
                      f"a frame p50 {p50 * 1000:.1f} ms, max {worst * 1000:.1f} ms "
                      f"(goal <= 25 ms)")  # fmt: skip
            want = "latency" in parts
            idle = sorted(_start_latency(db, tmp, 0, args.starts)) if want else []
            busy = sorted(_start_latency(db, tmp, 20, args.starts)) if want else []
            if idle and busy:
                p = [x[min(len(x) - 1, int(len(x) * q))] * 1000 for x in (idle, busy)
                     for q in (0.5, 0.99)]  # fmt: skip
                print(f"[{label}] start latency idle p50 {p[0]:.0f} ms p99 {p[1]:.0f} ms; with "
                      f"20 handlers writing at full speed p50 {p[2]:.0f} ms p99 {p[3]:.0f} ms "
                      f"(ratio of p99s {p[3] / max(p[1], 1e-9):.2f}, goal < 2)")  # fmt: skip


if __name__ == "__main__":
    main()
