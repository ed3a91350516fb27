"""`flowrun ls` on N instances: where its time goes after start-up (not a test).

Builds a SQLite file of N instances (mixed statuses, a failed one's error every tenth)
and times, in this process (medians of ``--repeat`` runs, process CPU seconds and wall):

* ``ls`` text: ``queries.read_instances(keys=TABLE_KEYS)`` + ``render.instance_table``
  (plain fitted text), against the previous path in the same run: every column read and
  turned into ``--json`` dicts, then a rich ``Table`` (16 s for 10,000 rows before);
* ``ls --json``: ``read_instances`` + ``instance_json`` + ``json_lines_array`` (one object
  per line, the C encoder), against ``json.dumps(rows, indent=2)`` (the pure-Python
  encoder) of the same rows.

Start-up (imports, engine, schema check) is not included: ``bench/cli_latency.py``
measures whole commands.

    python bench/ls_render.py [--n 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

FLOW = """\
flow: bench_ls
initial: work
states:
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


def build(path: Path, n: int):
    """A SQLite file of ``n`` instances; returns its engine."""
    from sqlalchemy import update

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine
    from runner.store.tables import instances

    (path.parent / "bench_ls.yaml").write_text(FLOW)
    flow = load_flow(path.parent / "bench_ls.yaml")
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        create_instances(conn, flow, [{"path": f"/data/in/file_{i}.csv"} for i in range(n)])
        conn.execute(
            update(instances)
            .where(instances.c.id % 10 == 0)
            .values(status="failed", last_error="exit code 1: boom\nmore")
        )
    return engine


def timed(fn, repeat: int) -> tuple[float, float]:
    """Median (CPU seconds, wall seconds) of ``repeat`` calls of ``fn``."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from runner.cli.render import instance_table, json_lines_array
    from runner.ops import queries, views

    with tempfile.TemporaryDirectory() as tmp:
        engine = build(Path(tmp) / "ls.db", args.n)

        def text_now() -> None:
            instance_table(queries.read_instances(engine, keys=views.TABLE_KEYS), width=80)

        def text_before() -> None:
            rows = queries.list_instances(engine)
            t = Table(box=None, pad_edge=False)
            for col in ("id", "flow", "state", "status", "att", "err", "rst", "due", "lock"):
                t.add_column(col, no_wrap=True, overflow="ellipsis")
            for r in rows:
                t.add_row(*(str(r[k]) for k in views.INSTANCE_KEYS[:9]))
            Console(width=80).print(t)

        def json_now() -> None:
            rows = queries.read_instances(engine)
            print(json_lines_array([views.instance_json(r) for r in rows]))

        def json_before() -> None:
            print(json.dumps(queries.list_instances(engine), indent=2))

        print(f"flowrun ls on {args.n} SQLite instances, medians of {args.repeat} (no start-up)")
        for name, now_fn, before_fn in (
            ("ls", text_now, text_before),
            ("ls --json", json_now, json_before),
        ):
            now = timed(now_fn, args.repeat)
            before = timed(before_fn, max(1, args.repeat // 2) if name == "ls" else args.repeat)
            print(
                f"  {name:10} now {now[0]:.3f} s CPU ({now[1]:.3f} s wall)   "
                f"before {before[0]:.3f} s CPU ({before[1]:.3f} s wall)   "
                f"ratio {before[0] / now[0]:.1f}x"
            )
        engine.dispose()


if __name__ == "__main__":
    main()
