"""Real daemons and ``exec`` handlers whose descendants leave their process group.

``flowrun kill`` ends an attempt's whole tree, escapees included; the handlers of a daemon
killed with SIGKILL are ended by the next daemon started on this host. Everything is read
from ``/proc`` and the SQLite file; every wait polls with a generous deadline.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from runner.store.create import create_instances
from tests.support.fault import Flowrun, engine_at, load, pid_alive, poll, sql, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# the handler, then a child that left its session, then one re-parented by a double fork
WORK = (
    "if [ -e fast ]; then exit 0; fi; "
    'echo $$ > "pid.$FLOWRUN_INSTANCE"; '
    'setsid sleep 1000 & echo $! > "esc.$FLOWRUN_INSTANCE"; '
    '(sleep 1000 & echo $! > "dbl.$FLOWRUN_INSTANCE"); '
    "sleep 1000"
)
FLOW = f"""\
initial: work
states:
  work:
    exec: [sh, -c, '{WORK}']
    next: done
  done: {{terminal: true}}
"""


def _setup(home: Path, n: int) -> Flowrun:
    fr = Flowrun(home)
    path = write_flow(fr.flows, "tree", FLOW)
    with engine_at(home).begin() as conn:
        create_instances(conn, load(path), [{} for _ in range(n)])
    return fr


def _pids(fr: Flowrun, n: int) -> list[int]:
    def ready() -> list[Path]:
        files = [p for pre in ("pid", "esc", "dbl") for p in fr.flows.glob(f"{pre}.*")]
        return files if len(files) == 3 * n and all(p.read_text().strip() for p in files) else []

    return [int(p.read_text()) for p in poll(ready, 60, what="handlers and escapees started")]


def test_kill_ends_the_whole_tree(tmp_path: Path) -> None:
    fr = _setup(tmp_path, 1)
    d = fr.daemon("--concurrency", "2", lease=5, worker_id="tree")
    try:
        pids = _pids(fr, 1)
        assert all(pid_alive(p) for p in pids)
        res = fr("kill", "1")
        assert res.returncode == 0, res.stderr
        poll(lambda: not any(pid_alive(p) for p in pids), 60, what="the whole tree ended")
        assert sql(engine_at(tmp_path), "SELECT outcome FROM attempts") == [("cancelled",)]
    finally:
        d.stop()


def test_handlers_of_a_sigkilled_daemon_are_ended_by_the_next(tmp_path: Path) -> None:
    fr = _setup(tmp_path, 2)
    d = fr.daemon("--concurrency", "2", lease=2, worker_id="doomed")
    try:
        pids = _pids(fr, 2)
        d.signal(signal.SIGKILL)
        d.wait(30)
    finally:
        d.stop()
    # checked at once: any flowrun daemon starting on this host may end them from now on
    assert all(pid_alive(p) for p in pids), "they died with the daemon: nothing to test"
    # ``reaper.end_orphans`` is host-wide by design: on a shared machine another test's
    # daemon may end them before ``d2`` does (even before it logs anything), so "d2
    # logged it" is not asserted; that they end once the next daemon started is.
    (fr.flows / "fast").touch()  # the retries (of the lost attempts) exit at once
    d2 = fr.daemon("--exit-when-idle", lease=2, worker_id="next", log="next")
    try:
        poll(lambda: not any(pid_alive(p) for p in pids), 60, what="the orphans ended")
        assert d2.wait(120) == 0, d2.log()[-3000:]
    finally:
        d2.stop()
        print(d.log(), d2.log(), sep="\n")  # shown by pytest when the test fails
    db = engine_at(tmp_path)
    assert sql(db, "SELECT status, count(*) FROM instances GROUP BY status") == [("completed", 2)]
