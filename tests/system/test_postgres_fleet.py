"""32 daemons on one PostgreSQL server with ``max_connections = 100``: every one works, and
none ever holds more connections than documented (``--pool-size`` 2 + 1 listening = 3;
with ``--pool-size 1``, 2).

Real ``flowrun --daemon`` processes share one fresh database and one flow; 500 instances
are started while they all run, and all complete. A watcher samples ``pg_stat_activity``
grouped by ``application_name`` (``flowrun <worker id>``, set by each daemon) all along,
from another database. No daemon may log a connection error.
"""

from __future__ import annotations

import collections
import signal
import threading
from pathlib import Path

import psycopg
import pytest

from runner.flowspec.compiler import load_flow
from runner.store.create import create_instances
from runner.store.db import make_engine
from tests.conftest import ADMIN_URL
from tests.support.fault import Flowrun, poll, sql, wait_completed, write_flow

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(240)]

DAEMONS = 32
INSTANCES = 500
BOUND = 2 + 1  # --pool-size (default 2) + the listening connection
SMALL = 4  # daemons run with --pool-size 1

FLOW = """\
initial: s1
states:
  s1: {call: "fleet_tasks:run", next: done}
  done: {terminal: true}
"""

#: What a daemon must never log: connection trouble (or a crash).
TROUBLE = ("too many clients", "remaining connection slots", "database unavailable",
           "cannot connect", "connection lost", "Traceback")  # fmt: skip


class Watcher(threading.Thread):
    """Samples, until stopped, how many connections each application holds in ``db``."""

    def __init__(self, db: str) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.peak: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        admin = ADMIN_URL.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(admin, autocommit=True) as c:
            while not self.done.is_set():
                rows = c.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend' "
                    "GROUP BY application_name",
                    (self.db,),
                ).fetchall()
                for name, count in rows:
                    self.peak[name] = max(self.peak[name], int(count))
                self.total = max(self.total, sum(int(n) for _, n in rows))
                self.samples += 1
                self.done.wait(0.05)


@pytest.mark.server_alone
def test_32_daemons_share_one_server_within_their_connection_bound(tmp_path: Path, pg_url):
    fr = Flowrun(tmp_path)
    path = write_flow(fr.flows, "fleet", FLOW, {"fleet_tasks": "def run(ctx):\n    return True\n"})
    fr.db = pg_url
    db = pg_url.rpartition("/")[2]
    engine = make_engine(pg_url, pool=1, application_name="fleet test")
    watcher = Watcher(db)
    watcher.start()
    ids = [f"fleet{k}" for k in range(DAEMONS)]
    # a few run with --pool-size 1: at most 1 + 1 connections
    small = set(ids[:SMALL])
    daemons = [
        fr.daemon("--concurrency", "4", *(["--pool-size", "1"] if w in small else []),
                  worker_id=w, log=w)
        for w in ids
    ]  # fmt: skip
    try:
        poll(
            lambda: sql(engine, "SELECT count(*) FROM workers")[0][0] >= DAEMONS,
            timeout=150,
            every=0.5,
            what=f"{DAEMONS} daemons registered",
        )
        with engine.begin() as conn:
            create_instances(conn, load_flow(path), [{"i": i} for i in range(INSTANCES)])
        wait_completed(engine, INSTANCES, timeout=120)
        for d in daemons:
            d.signal(signal.SIGINT)
        for d in daemons:
            assert d.wait(60) == 0, d.log()
    finally:
        watcher.done.set()
        watcher.join(10)
        for d in daemons:
            d.stop()
        engine.dispose()
    for w, d in zip(ids, daemons, strict=True):
        log = d.log()
        assert not [t for t in TROUBLE if t in log], f"{w}:\n{log}"
    names = {f"flowrun {w}": w for w in ids}
    seen = {name: n for name, n in watcher.peak.items() if name in names}
    assert len(seen) == DAEMONS, watcher.peak  # every daemon's connections are named
    assert max(seen.values()) <= BOUND, watcher.peak
    assert max(n for name, n in seen.items() if names[name] in small) <= 2, watcher.peak
    assert set(watcher.peak) <= {*names, "fleet test"}, watcher.peak  # nothing unnamed
    assert watcher.samples > 10
