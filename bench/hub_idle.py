"""What an idle sensor hub asks of the database (not a test): every statement counted.

A ``runner.sensors.hub.SensorHub`` runs in this process with one flow (a ``files`` sensor
on an empty folder, a ``cron`` sensor that does not fire, one rule) on the database
``--db``; once it is ready and has idled 2 s, every statement it sends for ``--seconds``
is logged (SQLAlchemy's ``before_cursor_execute``, plus each ``COMMIT``) and counted by
kind. With ``--lease`` L the leases are renewed every L/3 s; ``--poll`` is the rules'
look for pending events (0.5 s is the default on SQLite; a PostgreSQL daemon looks every
half lease, ``--idle-poll``).

To compare two trees, run the same file with ``PYTHONPATH`` set to each tree's root.

Usage::

    .venv/bin/python bench/hub_idle.py --db sqlite:////tmp/hub.db [--seconds 10]
                                       [--lease 6] [--poll 0.5] [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import event

from runner.flowspec.registry import FlowRegistry
from runner.sensors.hub import SensorHub
from runner.store.db import make_engine

FLOW = """\
flow: idle
sensors:
  inbox: {files: {path: inbox, glob: "*.csv"}}
  nightly: {cron: "0 3 * * *"}
rules:
  - when: inbox
    start: idle
initial: work
states: {work: {exec: [sh, -c, "exit 0"], next: done}, done: {terminal: true}}
"""


async def idle(url: str, seconds: float, lease: float, poll: float) -> list[tuple[float, str]]:
    """Run the hub on ``url`` and return ``(seconds since the window began, statement)``
    for every statement of the ``seconds`` window (``COMMIT`` for each commit)."""
    flows = Path(tempfile.mkdtemp()) / "flows"
    (flows / "inbox").mkdir(parents=True)
    (flows / "idle.yaml").write_text(FLOW)
    engine = make_engine(url)
    registry = FlowRegistry(flows)
    registry.load_all()
    seen: list[tuple[float, str]] = []
    since: list[float] = []

    def note(text: str) -> None:
        if since:
            seen.append((time.monotonic() - since[0], text))

    event.listen(engine, "before_cursor_execute", lambda *a: note(" ".join(a[2].split())))
    event.listen(engine, "commit", lambda _conn: note("COMMIT"))
    hub = SensorHub(engine, registry, "idler", lease)
    hub.poll = poll
    stop = asyncio.Event()
    task = asyncio.ensure_future(hub.run(stop))
    await asyncio.wait_for(hub.ready.wait(), 60)
    await asyncio.sleep(2.0)
    since.append(time.monotonic())
    await asyncio.sleep(seconds)
    since.clear()
    stop.set()
    await task
    engine.dispose()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="a SQLAlchemy URL (a fresh database)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--lease", type=float, default=6.0, help="sensor lease, seconds")
    ap.add_argument("--poll", type=float, default=0.5, help="rules' poll, seconds")
    ap.add_argument("--verbose", action="store_true", help="print every statement")
    args = ap.parse_args()
    seen = asyncio.run(idle(args.db, args.seconds, args.lease, args.poll))
    kinds = Counter(re.sub(r"\(.*", "", text)[:72] for _, text in seen)
    for kind, n in kinds.most_common():
        print(f"{n:5d}  {kind}")
    commits = sum(1 for _, text in seen if text == "COMMIT")
    print(f"{len(seen)} statements, {commits} commits in {args.seconds:g} s")
    if args.verbose:
        for at, text in seen:
            print(f"{at:7.2f}  {text[:120]}")


if __name__ == "__main__":
    main()
