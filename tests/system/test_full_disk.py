"""A full disk under the SQLite database: every CLI command answers one line
and a non-zero exit, nothing is half-written, a daemon asked to stop stops within its
grace, and once space is back the work completes.

The database lives on a 2 MB tmpfs mounted for the test (root only; skipped with the
reason otherwise) and filled with a file of zeros while a real daemon runs.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.disk import fill, small_disk
from tests.support.fault import Flowrun, poll, unique, write_flow

pytestmark = pytest.mark.timeout(300)

FLOW = """\
initial: a
defaults: {try_interval: 200ms}
states:
  a: {exec: [sleep, "5"], next: b}
  b: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs at ``tmp_path/disk``."""
    with small_disk(tmp_path / "disk") as folder:
        yield folder


def fill_under(db: Path, folder: Path, daemon_pid: int) -> Path:
    """Fill ``folder`` with the WAL of ``db`` emptied first, so that the very next write
    needs space: the daemon is paused (SIGSTOP) meanwhile, and the WAL truncated by a
    checkpoint (retried while the daemon was caught inside a transaction)."""
    for _ in range(100):
        os.kill(daemon_pid, signal.SIGSTOP)
        try:
            conn = sqlite3.connect(db, timeout=0)
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                conn.close()
            if busy == 0 and (db.parent / f"{db.name}-wal").stat().st_size == 0:
                return fill(folder)
        except sqlite3.OperationalError:
            pass
        finally:
            os.kill(daemon_pid, signal.SIGCONT)
        time.sleep(0.2)
    raise AssertionError("could not empty the WAL")


def count(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM instances").fetchone()[0]


def one_line(res: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_full_disk_cli_and_daemon(tmp_path: Path, disk: Path) -> None:
    fr = Flowrun(tmp_path)
    db = disk / "flowrun.db"
    fr.db = f"sqlite:///{db}"
    name = unique("slow")
    write_flow(fr.flows, name, FLOW)
    ids = [fr("start", name).stdout.strip() for _ in range(2)]
    assert all(i.isdigit() for i in ids), ids
    daemon = fr.daemon("--grace", "3", lease=5, worker_id=unique("full"))
    try:
        poll(lambda: "started" in daemon.log(), 120, what="daemon start")
        poll(lambda: "attempts running" in daemon.log() or _claimed(db), 60, what="claimed")
        filler = fill_under(db, disk, daemon.pid)
        # writes fail as one line, exit 75, and change nothing
        for args in (("start", name), ("pause", ids[0]), ("kill", "--flow", name)):
            res = fr(*args)
            line = one_line(res)
            assert res.returncode == 75, (args, res)
            assert line.startswith("flowrun: database write failed:") and "full" in line
        assert count(db) == 2
        res = fr("ls", "--json")  # reads may still work; if not, one line as well
        assert res.returncode in (0, 75), res
        if res.returncode:
            one_line(res)
        poll(lambda: "database unavailable" in daemon.log(), 60, what="daemon sees outage")
        # a stop while the disk is full ends within the grace, cleanly
        daemon.signal(signal.SIGINT)
        assert daemon.wait(60) == 0, daemon.log()
        assert "Traceback" not in daemon.log()
    finally:
        daemon.stop()
    filler.unlink()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # space is back: the instances complete (an attempt the stop could not record is
    # recovered once its lease has expired)
    res = fr("--daemon", "--exit-when-idle", "--lease", "3", timeout=180)
    assert res.returncode == 0, res.stderr
    rows = fr("ls", "--json", "--status", "completed")
    assert rows.stdout.count('"id"') == 2, rows.stdout


def _claimed(db: Path) -> bool:
    """An attempt is running now (its row is written only when it ends)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        query = "SELECT count(*) FROM instances WHERE running_attempt IS NOT NULL"
        return conn.execute(query).fetchone()[0] > 0
