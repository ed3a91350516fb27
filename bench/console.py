"""Console frame-refresh benchmark: query + render time at 1k, 100k and 1M instances.

One "frame" is what the console does on every live refresh (twice a second): read the
header (counts per status, throughput sparkline) and the visible page of instances from
SQLite through ``runner.tui.data.ConsoleData``, then render every visible line of the
instances view (``InstanceTable.render_line``) at 160x45. The database is a real SQLite
file (WAL) filled with ``executemany`` in one transaction.

Usage::

    .venv/bin/python bench/console.py                 # 1k, 100k, 1M
    .venv/bin/python bench/console.py --sizes 1000 --frames 50
    .venv/bin/python bench/console.py --db KEPT/big/flowrun.db   # a bench/scale.py database
    .venv/bin/python bench/console.py --db KEPT/big/flowrun.db --at newest  # its last minute
    .venv/bin/python bench/console.py --db postgresql+psycopg://...  # a PostgreSQL database

Prints p50/p95 per size of the frame (page + sparkline + render), for the top of the
list and for the middle, and of the counts per status, which run on their own
adaptive cadence (never more than ~10% of the time) in their own thread worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, insert  # noqa: E402

from runner.lifecycle import STATUSES
from runner.store.db import make_engine
from runner.store.tables import attempts, instances, workers

NOW = 1_700_000_000.0
FLOWS = ("ingest", "nightly-report", "thumbnails", "billing", "etl")
STATES = ("fetch", "validate", "transform", "archive", "done")


def populate(
    engine: Engine, n: int, *, attempts_per: float = 0.2, now: float = NOW, seed: int = 7
) -> None:
    """Insert ``n`` instances (and about ``n * attempts_per`` attempts) in one transaction.

    Statuses, flows and states are spread pseudo-randomly (fixed ``seed``); recent
    attempts finish within the last minute before ``now`` so the sparkline has data.
    """
    rnd = random.Random(seed)
    batch = 50_000
    weights = (40, 20, 5, 30, 4, 1)
    with engine.begin() as conn:
        for start in range(0, n, batch):
            rows = []
            for i in range(start, min(n, start + batch)):
                status = rnd.choices(STATUSES, weights)[0]
                locked = status == "runnable" and rnd.random() < 0.05
                errs = [now - rnd.random() * 3600 for _ in range(rnd.randint(0, 3))]
                rows.append(
                    {
                        "id": i + 1,
                        "flow": FLOWS[i % len(FLOWS)],
                        "version": "0123456789abcdef",
                        "state": STATES[rnd.randrange(len(STATES))],
                        "status": status,
                        "data": {"n": i},
                        "due_at": now + rnd.uniform(-60, 600),
                        "locked_by": "w1" if locked else None,
                        "locked_until": now + 30 if locked else None,
                        "attempts": rnd.randint(0, 9),
                        "errors": len(errs),
                        "restarts": rnd.randint(0, 1),
                        "state_errors": errs,
                        "last_error": "exit status 1: boom" if errs else None,
                        "state_changed": now - 100,
                        "created_at": now - 1000,
                        "updated_at": now - 10,
                    }
                )
            conn.execute(insert(instances), rows)
        n_att = int(n * attempts_per)
        for start in range(0, n_att, batch):
            rows = []
            for j in range(start, min(n_att, start + batch)):
                finished = now - (n_att - j) * 60.0 / max(n_att, 1) if j > n_att - 5000 else None
                fin = finished if finished is not None else now - 7200 - (n_att - j)
                rows.append(
                    {
                        # (instance, attempt) is the key: instances in turn, attempts 1, 2...
                        "instance_id": j % max(n, 1) + 1,
                        "attempt": j // max(n, 1) + 1,
                        "state": "fetch",
                        "worker": "w1",
                        "started_at": fin - 0.5,
                        "finished_at": fin,
                        "outcome": "moved",
                        "to_state": "validate",
                        "checkpoint": None,
                    }
                )
            conn.execute(insert(attempts), rows)
        conn.execute(
            insert(workers),
            [
                {
                    "id": "w1",
                    "host": "bench",
                    "pid": 1,
                    "started_at": now - 500,
                    "heartbeat_at": now - 1,
                    "running": 3,
                }
            ],
        )


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def _measure(
    path: str, frames: int, deep: bool, now: float = NOW
) -> tuple[list[float], list[float], float]:
    """Frame times (page + sparkline + render of every visible line), counts times, and
    the first paint (ms from opening the database to the first page shown, in-process:
    the console's imports are not counted)."""
    from runner.tui.app import FlowrunApp
    from runner.tui.widgets.instance_table import InstanceTable

    t_open = time.perf_counter()
    engine = make_engine(_url(path))
    app = FlowrunApp(engine, clock=lambda: now, live=False)
    frame_ms: list[float] = []
    count_ms: list[float] = []
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        first_paint_ms = (time.perf_counter() - t_open) * 1000
        table = app.screen.query_one(InstanceTable)
        data = app.data
        query = table.query_spec()
        for _ in range(max(5, frames // 4)):
            t0 = time.perf_counter()
            counts = data.counts(query)
            count_ms.append((time.perf_counter() - t0) * 1000)
        table.set_total(counts.total)
        offset = counts.total // 2 if deep else 0
        table.scroll_to(y=offset, animate=False, immediate=True)
        await pilot.pause()
        for k in range(frames):
            t0 = time.perf_counter()
            # what the refresh worker reads (in a thread in the app; timed inline here)
            off, limit = table.window()
            page = data.page(query, off, limit, total=table.total)
            spark = data.throughput(now + 0.5 * k)  # the console refreshes twice a second
            # what the UI loop does with it: install the page, render every visible line
            table.set_page(page)
            app.screen.header.set_spark(spark)
            for y in range(table.size.height):
                table.render_line(y)
            frame_ms.append((time.perf_counter() - t0) * 1000)
        assert table.page is not None and table.page.get(int(table.scroll_y)) is not None
    engine.dispose()
    return frame_ms, count_ms, first_paint_ms


def _url(db: str) -> str:
    """A database URL as given, or a SQLite file's."""
    return db if "://" in db else "sqlite:///" + db


def _newest_finish(path: str) -> float:
    """Just after the newest attempt's ``finished_at`` in ``path`` (epoch s)."""
    from sqlalchemy import func, select

    engine = make_engine(_url(path))
    with engine.connect() as conn:
        newest = conn.execute(select(func.max(attempts.c.finished_at))).scalar_one()
    engine.dispose()
    return (newest or time.time()) + 0.5


def _measure_file(path: str, frames: int, at: str) -> int:
    """Frame and first-paint times on an existing database file, as of ``at`` ("now", or
    "newest": just after the newest attempt finished, so a database built a while ago
    has its build's last minute of attempts in the sparkline); prints one JSON line."""
    now = _newest_finish(path) if at == "newest" else time.time()
    out: dict = {"db": path, "at": at}
    for deep in (False, True):
        t, c, first = asyncio.run(_measure(path, frames, deep, now))
        out["middle" if deep else "top"] = {
            "first_paint_ms": round(first, 1),
            "frame_p50_ms": round(statistics.median(t), 1),
            "frame_p95_ms": round(_pct(t, 0.95), 1),
            "counts_p95_ms": round(_pct(c, 0.95), 1),
        }
    print(json.dumps(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print p50/p95 frame times per size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--keep", help="folder to keep the databases in (reused if present)")
    ap.add_argument(
        "--db",
        help="measure this SQLite file or database URL instead (e.g. one bench/scale.py built)",
    )
    ap.add_argument(
        "--at",
        choices=["now", "newest"],
        default="now",
        help="with --db: the console's clock (newest: just after the newest attempt ended)",
    )
    args = ap.parse_args(argv)
    if args.db:
        return _measure_file(args.db, args.frames, args.at)
    folder = Path(args.keep or tempfile.mkdtemp(prefix="flowrun-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        path = folder / f"console-{size}.db"
        if not path.exists():
            t0 = time.perf_counter()
            engine = make_engine("sqlite:///" + str(path))
            populate(engine, size)
            engine.dispose()
            print(
                f"populated {size:>9,} instances in {time.perf_counter() - t0:.1f}s",
                file=sys.stderr,
            )
        for deep in (False, True):
            t, c, _first = asyncio.run(_measure(str(path), args.frames, deep))
            row = {
                "instances": size,
                "page": "middle" if deep else "top",
                "frame_p50_ms": round(statistics.median(t), 1),
                "frame_p95_ms": round(_pct(t, 0.95), 1),
                "counts_p50_ms": round(statistics.median(c), 1),
                "counts_p95_ms": round(_pct(c, 0.95), 1),
            }
            results.append(row)
            print(
                f"{size:>9,} instances  page={row['page']:<6}  frame (page+spark+render) "
                f"p50 {row['frame_p50_ms']:5.1f} ms  p95 {row['frame_p95_ms']:5.1f} ms   "
                f"counts (own cadence) p50 {row['counts_p50_ms']:5.1f} ms  "
                f"p95 {row['counts_p95_ms']:5.1f} ms",
                flush=True,
            )
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
