"""A daemon killed with SIGKILL is provably dead to the next daemon on its host: its
attempts are recorded ``lost`` and its sensors run again at once, not a lease later, and
``flowrun workers`` calls it dead at once (``runner.store.host``, ``runner.store.dead``).

Real daemons on one SQLite file, a real kill -9, real file appends; the lease is the
default 60 s, so anything waiting for it would take a minute.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from runner.store.create import create_instances
from tests.support.fault import Flowrun, engine_at, load, poll, sql, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LEASE = 60.0
#: Far less than the lease: what "at once" must mean on a loaded machine.
SOON = 25.0

SLEEPER = """\
initial: work
states:
  work:
    exec: [sh, -c, 'echo $$ > "pid.$FLOWRUN_INSTANCE"; sleep 120']
    next: done
  done: {terminal: true}
"""

ALERTS = """\
sensors:
  errors: {tail: {path: app.log, match: ERROR}}
rules:
  - when: errors
    start: alerts
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""


def _verdict(fr: Flowrun, worker: str) -> str:
    res = fr("workers", "--json")
    assert res.returncode == 0, res.stderr
    return {w["id"]: w["verdict"] for w in json.loads(res.stdout)}[worker]


def test_a_killed_daemon_is_taken_over_at_once(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    path = write_flow(fr.flows, "sleeper", SLEEPER)
    write_flow(fr.flows, "alerts", ALERTS)
    (fr.flows / "app.log").write_text("")
    db = engine_at(tmp_path)
    with db.begin() as conn:
        create_instances(conn, load(path), [{} for _ in range(3)])
    first = fr.daemon("--concurrency", "3", lease=LEASE, worker_id="doomed", log="doomed")
    second = None
    try:
        poll(lambda: len(list(fr.flows.glob("pid.*"))) == 3, 60, what="3 attempts running")
        poll(lambda: "sensors ready: alerts.errors" in first.log(), 60, what="tail sensor held")
        assert _verdict(fr, "doomed") == "alive"
        first.signal(signal.SIGKILL)
        first.wait(30)
        # its process is gone: dead at once, though its heartbeat is fresh and it holds
        # leases for another minute
        assert _verdict(fr, "doomed") == "dead"
        text = fr("workers").stdout
        assert [ln.split()[-1] for ln in text.splitlines() if ln.split()[:1] == ["doomed"]] == [
            "dead"
        ], text
        with (fr.flows / "app.log").open("a") as log:
            log.write("ERROR while nobody watched\n")
        started = time.monotonic()
        second = fr.daemon(lease=LEASE, worker_id="heir", log="heir")
        lost = "SELECT count(*) FROM attempts WHERE outcome = 'lost' AND worker = 'doomed'"
        poll(lambda: sql(db, lost) == [(3,)], SOON, what="the 3 attempts recorded lost")
        alerts = "SELECT count(*) FROM instances WHERE flow = 'alerts'"
        poll(lambda: sql(db, alerts) == [(1,)], SOON, what="the ERROR line's instance")
        assert time.monotonic() - started < SOON
        assert (
            "died mid-attempt" in sql(db, "SELECT error FROM attempts WHERE outcome = 'lost'")[0][0]
        )
        # the sleeper instances restarted here, under the new daemon's leases
        running = "SELECT count(*) FROM instances WHERE locked_by = 'heir'"
        poll(lambda: sql(db, running) == [(3,)], SOON, what="the instances restarted")
        assert _verdict(fr, "heir") == "alive"
    finally:
        first.stop()
        if second is not None:
            second.signal(signal.SIGINT)  # twice: abort, its handler groups killed
            poll(lambda: "stopping" in second.log(), 30, what="first SIGINT seen")
            second.signal(signal.SIGINT)
            second.wait(60)
            second.stop()
