"""A daemon cut off from PostgreSQL by a frozen network stops acting before its leases end.

Two real daemons share a fresh database; one (``cut``) reaches it through a TCP proxy the
test freezes (nothing forwarded, nothing closed: a black-holed network) while its
``exec`` handlers run 30 s jobs under a short lease. Every handler appends its start and
end to one ``O_APPEND`` log (a SIGTERM writes the end too), so overlapping runs of one
instance show there. The cut-off daemon must end its handlers before the other daemon
starts the instances again, nothing may be lost, and it must stop on SIGTERM within its
grace (and on a second SIGTERM within 3 s) while the network stays frozen.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from runner.flowspec.compiler import load_flow
from runner.store import flow_limits, leases, pools
from runner.store.clock import clock_of
from runner.store.db import IDLE_IN_TRANSACTION, STATEMENT_TIMEOUT, make_engine
from tests.support.fault import flowrun_cmd, poll, write_flow
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

LEASE = 5.0
GRACE = 3.0

FLOW = """\
flow: slow
initial: work
states:
  work: {exec: [python, slow.py], next: done}
  done: {terminal: true}
"""

# the first attempt is the long job; a restart finishes at once
HANDLER = """\
import os, signal, sys, time

LOG = os.environ["FENCE_LOG"]
me = f"{os.environ['FLOWRUN_INSTANCE']} {os.environ['FLOWRUN_ATTEMPT']} {os.getpid()}"


def line(what):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{what} {me} {time.time():.6f}\\n".encode())
    os.close(fd)


def term(*_):
    line("end")
    sys.exit(143)


signal.signal(signal.SIGTERM, term)
line("start")
time.sleep(30 if os.environ["FLOWRUN_ATTEMPT"] == "1" else 0.2)
line("end")
"""


def _runs(log: Path) -> dict[tuple[int, int], dict[str, float]]:
    """``(instance, attempt)`` -> ``{"start": t, "end": t}`` from the handlers' log."""
    runs: dict[tuple[int, int], dict[str, float]] = {}
    if not log.exists():
        return runs
    for ln in log.read_text().splitlines():
        what, iid, attempt, _pid, at = ln.split()
        runs.setdefault((int(iid), int(attempt)), {})[what] = float(at)
    return runs


def _daemon(flows: Path, url: str, worker: str, logfile: Path, env: dict) -> subprocess.Popen:
    with logfile.open("wb") as out:
        return subprocess.Popen(
            [*flowrun_cmd(), "--flows", str(flows), "--db", url, "--lease", f"{LEASE:g}"]
            + ["--grace", f"{GRACE:g}", "--concurrency", "4"]
            + ["--daemon", "--worker-id", worker],
            cwd=flows.parent,
            env=env,
            stdout=out,
            stderr=out,
        )


def _world(pg_url: str, tmp_path: Path):
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "slow.yaml").write_text(FLOW)
    (flows / "slow.py").write_text(HANDLER)
    host_port = pg_url.split("@", 1)[1].split("/", 1)[0]
    host, _, port = host_port.partition(":")
    proxy = TcpProxy((host, int(port or 5432)))
    via_proxy = pg_url.replace(f"@{host_port}/", f"@127.0.0.1:{proxy.port}/")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env["FENCE_LOG"] = str(tmp_path / "handlers.log")
    return flows, proxy, via_proxy, env


def _start(flows: Path, url: str, n: int) -> None:
    for _ in range(n):
        subprocess.run(
            [*flowrun_cmd(), "--flows", str(flows), "--db", url, "start", "slow"],
            check=True,
            capture_output=True,
        )


def _completed(engine) -> int:
    with engine.connect() as conn:
        q = text("SELECT count(*) FROM instances WHERE status='completed'")
        return conn.execute(q).scalar_one()


def _stopped_within(proc: subprocess.Popen, seconds: float, log: Path) -> float:
    """Seconds until ``proc`` exits; fails past ``seconds`` (then kills it), showing its
    ``log``."""
    t0 = time.monotonic()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {seconds}s later:\n{log.read_text()}") from None
    return time.monotonic() - t0


def test_cut_off_daemon_ends_its_handlers_before_another_takes_over(
    pg_url: str, tmp_path: Path
) -> None:
    flows, proxy, via_proxy, env = _world(pg_url, tmp_path)
    log = tmp_path / "handlers.log"
    engine = make_engine(pg_url)
    cut_log, other_log = tmp_path / "cut.log", tmp_path / "other.log"
    _start(flows, pg_url, 4)
    cut = _daemon(flows, via_proxy, "cut", cut_log, env)
    other = None
    try:
        poll(lambda: len(_runs(log)) == 4, 60, what="4 handlers started by the cut daemon")
        other = _daemon(flows, pg_url, "other", other_log, env)
        poll(lambda: "started (concurrency" in other_log.read_text(), 60, what="other ready")
        time.sleep(LEASE / 3 + 0.5)  # a renewal through the proxy since
        proxy.freeze()
        frozen_at = time.time()
        restarts = lambda: [k for k in _runs(log) if k[1] == 2]  # noqa: E731
        poll(lambda: len(restarts()) == 4, 60, what="the other daemon restarted all 4")
        runs = _runs(log)
        for iid, attempt in restarts():
            first, second = runs[(iid, 1)], runs[(iid, attempt)]
            assert "end" in first, (iid, runs)  # ended by the cut-off daemon's fence
            assert first["end"] < second["start"], (iid, first, second)
            assert first["end"] - frozen_at < LEASE, (iid, first["end"] - frozen_at)
        assert "lease not renewed in time" in cut_log.read_text()
        assert cut.poll() is None

        # still frozen: SIGTERM stops it within its grace (and a moment for the exit)
        cut.send_signal(signal.SIGTERM)
        took = _stopped_within(cut, GRACE + 4, cut_log)
        assert took <= GRACE + 1.5, (took, cut_log.read_text())
        proxy.thaw()
        poll(lambda: _completed(engine) == 4, 60, what="all 4 completed")
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT instance_id, attempt, worker, outcome FROM attempts ORDER BY 1, 2")
            ).all()
        # nothing lost: each instance ran twice, the cut daemon's attempt recorded lost
        assert [(r[1], r[2], r[3]) for r in rows] == [(1, "cut", "lost"), (2, "other", "moved")] * 4
        assert "Traceback" not in cut_log.read_text()
    finally:
        for p in (cut, other):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        proxy.close()
        engine.dispose()


CALL_FLOW = """\
flow: slow
initial: work
states:
  work: {call: "slow_call:run", next: done}
  done: {terminal: true}
"""

# an async ``call`` handler: 30 s on the first attempt; its cancellation is logged as its end
CALL_HANDLER = """\
import asyncio, os, time


def line(what, ctx):
    fd = os.open(os.environ["FENCE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    me = f"{ctx.instance_id} {ctx.attempt} {os.getpid()}"
    os.write(fd, f"{what} {me} {time.time():.6f}\\n".encode())
    os.close(fd)


async def run(ctx):
    line("start", ctx)
    try:
        await asyncio.sleep(30 if ctx.attempt == 1 else 0.2)
    finally:
        line("end", ctx)
    return True
"""


@pytest.mark.parametrize("kind", ["exec", "async call"])
def test_a_fenced_attempt_is_recorded_lost_when_the_database_is_back(
    pg_url: str, tmp_path: Path, kind: str
) -> None:
    """Alone, the cut-off daemon ends its handler before its lease ends (an ``exec``
    handler's process group signalled, an ``async def`` ``call`` handler cancelled); once
    the network thaws it records the attempt ``lost`` (one restart) and runs the instance
    again."""
    flows, proxy, via_proxy, env = _world(pg_url, tmp_path)
    if kind == "async call":
        (flows / "slow.yaml").write_text(CALL_FLOW)
        (flows / "slow_call.py").write_text(CALL_HANDLER)
    log = tmp_path / "handlers.log"
    engine = make_engine(pg_url)
    _start(flows, pg_url, 1)
    daemon_log = tmp_path / "cut.log"
    cut = _daemon(flows, via_proxy, "cut", daemon_log, env)
    try:
        poll(lambda: len(_runs(log)) == 1, 60, what="the handler started")
        time.sleep(LEASE / 3 + 0.5)
        proxy.freeze()
        frozen_at = time.time()
        poll(lambda: "end" in _runs(log)[(1, 1)], 30, what="the handler ended by the fence")
        assert _runs(log)[(1, 1)]["end"] - frozen_at < LEASE
        time.sleep(max(0.0, frozen_at + LEASE + 1 - time.time()))
        proxy.thaw()
        poll(lambda: _completed(engine) == 1, 60, what="completed after the thaw")
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT attempt, worker, outcome FROM attempts ORDER BY attempt")
            ).all()
            restarts = conn.execute(text("SELECT restarts FROM instances")).scalar_one()
        assert [tuple(r) for r in rows] == [(1, "cut", "lost"), (2, "cut", "moved")]
        assert restarts == 1
        assert "Traceback" not in daemon_log.read_text()
    finally:
        if cut.poll() is None:
            cut.terminate()
            try:
                cut.wait(20)
            except subprocess.TimeoutExpired:
                cut.kill()
                cut.wait()
        proxy.close()
        engine.dispose()


def test_second_sigterm_stops_a_frozen_daemon_within_3s(pg_url: str, tmp_path: Path) -> None:
    flows, proxy, via_proxy, env = _world(pg_url, tmp_path)
    log = tmp_path / "handlers.log"
    _start(flows, pg_url, 2)
    daemon_log = tmp_path / "cut.log"
    cut = _daemon(flows, via_proxy, "cut", daemon_log, env)
    try:
        poll(lambda: len(_runs(log)) == 2, 60, what="2 handlers started")
        proxy.freeze()
        time.sleep(1.0)
        cut.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        cut.send_signal(signal.SIGTERM)
        took = _stopped_within(cut, 10, daemon_log)
        assert took <= 3.0, (took, daemon_log.read_text())
        assert cut.returncode == 128 + signal.SIGTERM, daemon_log.read_text()
        assert "Traceback" not in daemon_log.read_text()
        # its handlers went with it
        pids = [int(ln.split()[3]) for ln in log.read_text().splitlines() if ln.startswith("start")]
        for pid in pids:
            poll(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 10, what=f"handler {pid} gone")
    finally:
        if cut.poll() is None:
            cut.kill()
            cut.wait()
        proxy.close()


def test_connections_detect_a_silent_peer_within_seconds(pg_url: str) -> None:
    """Every pooled connection carries TCP keepalives and ``tcp_user_timeout`` (the
    kernel's defaults notice a black-holed peer after hours), unless the URL says
    otherwise."""
    engine = make_engine(pg_url)
    own = make_engine(pg_url + "?keepalives_idle=30")
    try:
        with engine.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()
        assert params["keepalives"] == "1"
        assert params["tcp_user_timeout"] == "5000"
        assert int(params["keepalives_idle"]) + 3 * int(params["keepalives_interval"]) <= 10
        with own.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()
        assert params["keepalives_idle"] == "30"
    finally:
        engine.dispose()
        own.dispose()


def test_a_cycle_statement_is_cancelled_by_the_server_past_its_timeout(pg_url: str) -> None:
    """A worker cycle's transaction (begun by ``leases.by_index``) cancels a statement
    after ``STATEMENT_TIMEOUT`` (a lock wait, say) instead of waiting on; the same
    statement reads the server's clock."""
    engine = make_engine(pg_url)
    try:
        t0 = time.monotonic()
        with pytest.raises(DBAPIError, match="statement timeout"):
            with engine.begin() as conn:
                leases.by_index(conn)
                conn.execute(text("SELECT pg_sleep(30)"))
        assert time.monotonic() - t0 < STATEMENT_TIMEOUT + 2
        assert clock_of(engine).error < 0.5  # read, with a round trip's error
    finally:
        engine.dispose()


# a daemon stopped while it holds a pool's row: in a worker's cycle (the transaction
# begun as the cycle begins it, ``leases.by_index``, the pool locked as a claim settles
# it), or in a rule starting an instance of a flow with ``on_limit: skip`` (the flow
# limit's row, ``flow_limits.refusal``)
HOLDER = """\
import sys, time
from pathlib import Path
from runner.flowspec.compiler import load_flow
from runner.store import flow_limits, leases, pools
from runner.store.db import make_engine

engine = make_engine(sys.argv[1])
with engine.begin() as conn:
    if sys.argv[2] == "cycle":
        leases.by_index(conn)
        pools.lock(conn, "warehouse", 2, time.time())
    else:
        assert flow_limits.refusal(conn, load_flow(Path(sys.argv[3])), {}, time.time()) is None
    print("locked", flush=True)
    time.sleep(600)  # SIGSTOPped here
"""

NIGHTLY = """\
max_running: 1
on_limit: skip
initial: work
states:
  work: {exec: [/bin/true], next: done}
  done: {terminal: true}
"""


@pytest.mark.parametrize("where", ["cycle", "rule"])
def test_a_daemon_frozen_holding_a_pool_loses_its_locks_to_the_server(
    pg_url: str, tmp_path: Path, where: str
) -> None:
    """A daemon stopped (SIGSTOP) in the middle of a transaction that holds a pool's row
    (a cycle's claim, a rule's start under a flow limit) does not stall the other daemons'
    claims of that pool until it resumes: the server ends its idle transaction after
    ``IDLE_IN_TRANSACTION`` seconds and the row is free."""
    flow = write_flow(tmp_path, "nightly", NIGHTLY)
    name = "warehouse" if where == "cycle" else "flow:nightly"
    engine = make_engine(pg_url)
    with engine.begin() as conn:  # the pool's row, made before the holder locks it
        if where == "cycle":
            pools.lock(conn, name, 2, time.time())
        else:
            assert flow_limits.refusal(conn, load_flow(flow), {}, time.time()) is None
    argv = [sys.executable, "-c", HOLDER, pg_url, where, str(flow)]
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        os.kill(holder.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with engine.begin() as conn:  # another daemon's claim of the same pool
            conn.execute(text("SET LOCAL lock_timeout = '30s'"))
            locked = conn.execute(
                text("SELECT name FROM pools WHERE name = :n FOR UPDATE"), {"n": name}
            ).scalar_one()
        waited = time.monotonic() - t0
        assert locked == name
        assert IDLE_IN_TRANSACTION - 1 < waited < IDLE_IN_TRANSACTION + 5, waited
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
        engine.dispose()
