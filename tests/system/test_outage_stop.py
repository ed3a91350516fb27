"""Stopping a daemon after and during a PostgreSQL outage: SIGTERM is a clean
stop (exit 0, no traceback, one log line per fault) and nothing is lost: once the
database is back every instance completes.

The outage is one daemon's only: it reaches the shared server through a TCP proxy
(``tests.support.tcp_proxy``) that the test cuts; the server itself never stops.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from runner.store.db import make_engine
from tests.support.fault import Flowrun, poll, unique, write_flow
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]

# the handler of `a` runs until the file `hold` leaves the flows folder
FLOW = """\
initial: a
defaults: {try_interval: 200ms}
states:
  a: {exec: [sh, -c, "while [ -e hold ]; do sleep 0.2; done"], next: b}
  b: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


def test_sigterm_after_and_during_outage(tmp_path: Path, pg_url: str) -> None:
    url = make_url(pg_url)
    engine = make_engine(pg_url)
    fr = Flowrun(tmp_path)
    name = unique("slow")
    write_flow(fr.flows, name, FLOW)

    def claimed_by(worker: str) -> int:
        with engine.connect() as conn:
            query = text("SELECT count(*) FROM instances WHERE locked_by = :w")
            return conn.execute(query, {"w": worker}).scalar_one()

    (fr.flows / "hold").write_text("")
    with TcpProxy((url.host or "127.0.0.1", url.port or 5432)) as proxy:
        fr.db = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        ids = [fr("start", name).stdout.strip() for _ in range(3)]
        assert all(i.isdigit() for i in ids), ids
        for during in (False, True):
            stop_daemon(fr, proxy, claimed_by, during)
    # nothing lost: straight to the server, every instance completes (attempts the stop
    # could not record are recovered once their lease has expired)
    (fr.flows / "hold").unlink()
    fr.db = pg_url
    res = fr("--daemon", "--exit-when-idle", "--lease", "5", timeout=240)
    assert res.returncode == 0, res.stderr
    with engine.connect() as conn:
        statuses = conn.execute(text("SELECT status FROM instances")).scalars().all()
    assert statuses == ["completed"] * 3
    engine.dispose()


def stop_daemon(fr: Flowrun, proxy: TcpProxy, claimed_by, during: bool) -> None:
    """Run a daemon until it has claimed work, cut its database, and SIGTERM it during
    the outage (``during``) or once the database is back: exit 0, no traceback."""
    worker = unique("outage")
    daemon = fr.daemon("--grace", "2", lease=5, worker_id=worker)
    try:
        poll(lambda: "started" in daemon.log(), 120, what="daemon start")
        poll(lambda: claimed_by(worker), 60, what="an instance claimed")
        proxy.cut()
        poll(lambda: "database unavailable" in daemon.log(), 60, what="outage seen")
        if not during:
            proxy.restore()
            poll(lambda: "reachable again" in daemon.log(), 60, what="database back")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(90) == 0, daemon.log()
        assert "Traceback" not in daemon.log(), daemon.log()
        # while it stops, its heartbeat, renewals and fence checks fail several times a
        # second: the outage was said already, repeats are folded (at most every 30 s)
        stopping = daemon.log().rsplit("SIGTERM: stopping", 1)[1]
        assert stopping.count("database unavailable") <= 1, daemon.log()
    finally:
        daemon.stop()
        proxy.restore()
