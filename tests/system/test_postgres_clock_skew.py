"""A daemon whose host clock is 90 s off neither steals nor loses leases on PostgreSQL.

Two real daemons share a fresh database; one runs under a launcher that shifts its
``time.time()`` by ±90 s before flowrun is imported (a host with a wrong clock; its
handlers, separate processes, keep the true time). The shifted one claims three of six
instances, the other the other three; their handlers run until the test lets them go,
after both daemons held their leases side by side for several leases: every instance must
run exactly once (one attempt, no ``lost``), and the shifted daemon must log its clock's
offset once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from runner.store.db import make_engine
from tests.support.fault import flowrun_cmd, poll

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

LEASE = 3.0

FLOW = """\
flow: slow
initial: work
states:
  work: {exec: [python, slow.py], next: done}
  done: {terminal: true}
"""

HANDLER = """\
import os, time

fd = os.open(os.environ["SKEW_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, f"start {os.environ['FLOWRUN_INSTANCE']} {os.environ['FLOWRUN_ATTEMPT']}\\n".encode())
while not os.path.exists(os.environ["SKEW_GO"]):  # the test lets every handler go at once
    time.sleep(0.05)
"""

#: ``python -c`` this, then flowrun's arguments: flowrun on a host whose clock is off
SHIFTED = """\
import sys, time
_true, _skew = time.time, float(sys.argv.pop(1))
time.time = lambda: _true() + _skew
from runner.cli.main import main
sys.exit(main())
"""


def _daemon(args: list[str], flows: Path, url: str, worker: str, log: Path, env: dict):
    with log.open("wb") as out:
        return subprocess.Popen(
            [*args, "--flows", str(flows), "--db", url, "--lease", f"{LEASE:g}"]
            + ["--concurrency", "3", "--prefetch", "0", "--daemon", "--worker-id", worker],
            cwd=flows.parent,
            env=env,
            stdout=out,
            stderr=out,
        )


def _count(engine, where: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {where}")).scalar_one()


def _db_now(engine) -> float:
    """The database server's time (epoch seconds)."""
    with engine.connect() as conn:
        now = conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one()
    return float(now)


def _held_past(engine, at: float) -> bool:
    """Whether every instance's lease was renewed to end after ``at`` (the database's
    epoch seconds)."""
    with engine.connect() as conn:
        ends = conn.execute(text("SELECT locked_until FROM instances")).scalars().all()
    return all(end is not None and end > at for end in ends)


@pytest.mark.parametrize("skew", [90.0, -90.0])
def test_a_skewed_host_neither_steals_nor_loses_leases(
    pg_url: str, tmp_path: Path, skew: float
) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "slow.yaml").write_text(FLOW)
    (flows / "slow.py").write_text(HANDLER)
    starts = tmp_path / "starts.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env.update(SKEW_LOG=str(starts), SKEW_GO=str(tmp_path / "go"))
    engine = make_engine(pg_url)
    for _ in range(6):
        subprocess.run(
            [*flowrun_cmd(), "--flows", str(flows), "--db", pg_url, "start", "slow"],
            check=True,
            capture_output=True,
        )
    off_log, true_log = tmp_path / "shifted.log", tmp_path / "true.log"
    shifted = _daemon(
        [sys.executable, "-c", SHIFTED, f"{skew:g}"], flows, pg_url, "shifted", off_log, env
    )
    procs = [shifted]
    try:
        # the shifted daemon claims first (3: its concurrency), then the other the rest
        started = lambda: len(starts.read_text().splitlines()) if starts.exists() else 0  # noqa: E731
        poll(lambda: started() >= 3, 60, what="the shifted daemon's 3 handlers")
        procs.append(_daemon(flowrun_cmd(), flows, pg_url, "true", true_log, env))
        poll(lambda: started() >= 6, 60, what="the other daemon's 3 handlers")
        # both hold their leases side by side, each looking for lost attempts meanwhile
        since = _db_now(engine)
        poll(lambda: _held_past(engine, since + 3 * LEASE), 60, what="leases renewed 3 leases on")
        (tmp_path / "go").touch()
        poll(lambda: _count(engine, "instances WHERE status='completed'") == 6, 90, what="done")
        lines = starts.read_text().splitlines()
        assert sorted(lines) == sorted(f"start {i} 1" for i in range(1, 7)), lines
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT worker, outcome FROM attempts")).all()
        assert sorted(o for _, o in rows) == ["moved"] * 6, rows
        assert {w for w, _ in rows} == {"shifted", "true"}, rows  # both ran some
        warned = [ln for ln in off_log.read_text().splitlines() if "clock is" in ln]
        assert len(warned) == 1, off_log.read_text()
        assert f"{-skew:+.1f} s off" not in warned[0] and f"{skew:+.1f} s off" in warned[0]
        assert "clock is" not in true_log.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        engine.dispose()
