"""Scale-out on one PostgreSQL database: many daemons, real processes, real server.

Each test seeds ``N`` instances of a small flow (two ``call`` states with fast ``async``
handlers, then a terminal state), runs ``flowrun --daemon --exit-when-idle`` processes
against a fresh database (``pg_url``), and checks from the database and from a log the
handlers append to that every attempt ran exactly once, unless a lease expired:

- for each (instance, state) exactly one ``moved`` attempt, no attempt left open;
- each handler execution is logged once, except for instances that had a ``lost``
  attempt (a lease expired: the new owner runs the state again, by design);
- the database password (given in every URL) appears in no output.

Faults: ``kill -9`` of one daemon mid-run (short ``--lease``), a restart of the PostgreSQL
server mid-run, and two daemons "on two hosts" (separate UTS/network/PID namespaces via
``unshare``, reaching the server through its Unix socket; skipped when unavailable).
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from runner.flowspec.compiler import load_flow
from runner.ops.liveness import list_workers
from runner.store.create import create_instances
from runner.store.db import make_engine
from runner.store.tables import attempts, instances

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
N = 5000
PASSWORD = "s3cr3t-pw-never-shown"

FLOW = """\
flow: pgscale
description: two fast async call states
initial: first
defaults:
  try_interval: 1s
  backoff: {initial: 0s, factor: 1, max: 0s, jitter: none}
states:
  first: {call: "pgscale_tasks:step", next: second}
  second: {call: "pgscale_tasks:step", next: done}
  done: {terminal: true}
"""

TASKS = '''\
"""Handlers of the PostgreSQL scale-out tests: log each execution, then move on."""

import asyncio
import os

_fd = None


async def step(ctx):
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["PGSCALE_RUNLOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(_fd, f"{ctx.instance_id} {ctx.state} {ctx.attempt}\\n".encode())
    await asyncio.sleep(0.001)
    return True
'''


def with_password(url: str) -> str:
    """``url`` with :data:`PASSWORD` added (the server trusts 127.0.0.1 and ignores it)."""
    scheme, _, rest = url.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{PASSWORD}@{host}"


def flowrun_argv() -> list[str]:
    """The ``flowrun`` console script next to this interpreter."""
    script = Path(sys.executable).parent / "flowrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runner.cli"]


class Cluster:
    """A flows folder, a seeded database and the daemons draining it."""

    def __init__(self, home: Path, url: str, n: int = N) -> None:
        self.home, self.url, self.n = home, with_password(url), n
        self.flows = home / "flows"
        self.flows.mkdir()
        (self.flows / "pgscale.yaml").write_text(FLOW)
        (self.flows / "pgscale_tasks.py").write_text(TASKS)
        self.runlog = home / "runs.log"
        self.runlog.touch()
        self.engine = make_engine(self.url)
        flow = load_flow(self.flows / "pgscale.yaml")
        with self.engine.begin() as conn:
            create_instances(conn, flow, [{"i": i} for i in range(n)])
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env["PGSCALE_RUNLOG"] = str(self.runlog)
        self.env = env

    def daemon_argv(self, *, url: str | None = None, lease: float = 3, worker_id: str | None):
        """The argv of one daemon (``worker_id`` None: the default ``host:pid``)."""
        argv = [
            *flowrun_argv(),
            "--flows",
            str(self.flows),
            "--db",
            url or self.url,
            "--lease",
            str(lease),
            "--daemon",
            "--exit-when-idle",
            "--concurrency",
            "8",
            "--grace",
            "5",
        ]
        if worker_id:
            argv += ["--worker-id", worker_id]
        return argv

    def start(self, name: str, argv: list[str] | None = None, **kw) -> None:
        """Start daemon ``name`` (its stderr goes to ``<name>.log``)."""
        log = self.home / f"{name}.log"
        self.logs[name] = log
        self.procs[name] = subprocess.Popen(
            argv or self.daemon_argv(worker_id=name, **kw),
            cwd=self.home,
            env=self.env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def moved(self) -> int:
        """How many attempts have moved an instance so far."""
        with self.engine.connect() as conn:
            q = select(func.count()).where(attempts.c.outcome == "moved")
            return conn.execute(q).scalar_one()

    def wait_progress(self, moved: int, timeout: float = 60) -> None:
        """Block until at least ``moved`` transitions are committed."""
        deadline = time.monotonic() + timeout
        while self.moved() < moved:
            assert time.monotonic() < deadline, f"no progress to {moved} moves in {timeout}s"
            for name, p in self.procs.items():
                assert p.poll() is None, f"daemon {name} exited early:\n{self.log_text(name)}"
            time.sleep(0.1)

    def wait_all(self, timeout: float = 120) -> dict[str, int]:
        """Wait for every daemon to exit; returns their exit codes."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                codes[name] = "timeout"
        return codes

    def stop_all(self) -> None:
        """Kill whatever still runs (test clean-up)."""
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.engine.dispose()

    def log_text(self, name: str) -> str:
        """Daemon ``name``'s log (its last 3000 characters)."""
        return self.logs[name].read_text(errors="replace")[-3000:]

    def check_exactly_once(self) -> dict:
        """Every instance completed, one ``moved`` attempt per (instance, state), each
        execution once except after a lost lease; the password in no log. Returns
        figures (attempt outcomes, re-executions, workers that moved something)."""
        with self.engine.connect() as conn:
            status = dict(
                conn.execute(
                    select(instances.c.status, func.count()).group_by(instances.c.status)
                ).all()
            )
            assert status == {"completed": self.n}, status
            outcomes = dict(
                conn.execute(
                    select(attempts.c.outcome, func.count()).group_by(attempts.c.outcome)
                ).all()
            )
            assert None not in outcomes, f"attempts left open: {outcomes}"
            per_state = conn.execute(
                select(attempts.c.instance_id, attempts.c.state, func.count())
                .where(attempts.c.outcome == "moved")
                .group_by(attempts.c.instance_id, attempts.c.state)
            ).all()
            assert len(per_state) == 2 * self.n
            doubled = [r for r in per_state if r[2] != 1]
            assert not doubled, f"(instance, state) moved more than once: {doubled[:5]}"
            lost_ids = {
                i
                for (i,) in conn.execute(
                    select(attempts.c.instance_id).where(attempts.c.outcome == "lost")
                )
            }
            movers = {
                w
                for (w,) in conn.execute(
                    select(attempts.c.worker).where(attempts.c.outcome == "moved").distinct()
                )
            }
        runs = collections.Counter(
            tuple(line.split()[:2]) for line in self.runlog.read_text().splitlines() if line
        )
        expected = {(str(i), s) for i, s, _ in per_state}
        assert set(runs) == expected, "the handler log and the attempts table disagree"
        again = {k: c for k, c in runs.items() if c > 1}
        unexplained = {k: c for k, c in again.items() if int(k[0]) not in lost_ids}
        assert not unexplained, f"ran twice without a lost lease: {list(unexplained)[:5]}"
        for name in self.logs:
            assert PASSWORD not in self.logs[name].read_text(errors="replace"), name
        return {"outcomes": outcomes, "reruns": len(again), "movers": movers}


@pytest.fixture
def cluster(tmp_path, pg_url):
    """A seeded :class:`Cluster` on a fresh database (daemons killed at the end)."""
    c = Cluster(tmp_path, pg_url)
    yield c
    c.stop_all()


def test_four_daemons_run_each_attempt_exactly_once(cluster):
    t0 = time.monotonic()
    for i in range(1, 5):
        cluster.start(f"w{i}")
    codes = cluster.wait_all()
    elapsed = time.monotonic() - t0
    assert codes == {f"w{i}": 0 for i in range(1, 5)}, {n: cluster.log_text(n) for n in codes}
    figures = cluster.check_exactly_once()
    assert figures["outcomes"] == {"moved": 2 * N}, figures
    assert figures["reruns"] == 0
    assert figures["movers"] == {"w1", "w2", "w3", "w4"}, "every daemon should have worked"
    verdicts = {w["id"]: w["verdict"] for w in list_workers(cluster.engine)}
    assert verdicts == {f"w{i}": "stopped" for i in range(1, 5)}
    print(f"\n4 daemons, {2 * N} transitions in {elapsed:.1f}s")


def test_kill_9_one_daemon_mid_run_everything_completes(cluster):
    for i in range(1, 5):
        cluster.start(f"w{i}")
    cluster.wait_progress(N // 2)
    victim = cluster.procs["w2"]
    os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    codes = cluster.wait_all()
    assert codes["w2"] == -signal.SIGKILL
    survivors = {n: c for n, c in codes.items() if n != "w2"}
    assert survivors == {"w1": 0, "w3": 0, "w4": 0}, {n: cluster.log_text(n) for n in codes}
    figures = cluster.check_exactly_once()
    with cluster.engine.connect() as conn:
        lost_by = {
            w
            for (w,) in conn.execute(
                select(attempts.c.worker).where(attempts.c.outcome == "lost").distinct()
            )
        }
    assert lost_by <= {"w2"}, f"only the killed daemon's attempts may be lost: {lost_by}"
    # The killed worker never said goodbye: dead once its heartbeat is stale and its
    # leases (3 s) expired; the others stopped cleanly.
    later = list_workers(cluster.engine, now=max(time.time(), killed_at) + 10)
    verdicts = {w["id"]: (w["verdict"], w["alive"]) for w in later}
    assert verdicts["w2"] == ("dead", False)
    assert {verdicts[w][0] for w in ("w1", "w3", "w4")} == {"stopped"}
    print(f"\nkill -9: outcomes {figures['outcomes']}, re-executions {figures['reruns']}")


def _restart_server() -> None:
    version = "15"
    res = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.server_alone
@pytest.mark.skipif(
    shutil.which("pg_ctlcluster") is None or os.geteuid() != 0,
    reason="restarting the server needs pg_ctlcluster and root",
)
def test_server_restart_mid_run_everything_completes(cluster):
    for i in range(1, 5):
        cluster.start(f"w{i}", lease=10)
    cluster.wait_progress(N // 2)
    _restart_server()
    codes = cluster.wait_all(timeout=150)
    assert codes == {f"w{i}": 0 for i in range(1, 5)}, {n: cluster.log_text(n) for n in codes}
    cluster.engine.dispose()  # its pooled connections died with the server
    logs = "".join(cluster.log_text(n) for n in codes)
    assert "database unavailable" in logs, "the restart did not reach the daemons mid-run"
    figures = cluster.check_exactly_once()
    print(f"\nserver restart: outcomes {figures['outcomes']}, re-executions {figures['reruns']}")


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    res = subprocess.run(
        ["unshare", "--uts", "--net", "--pid", "--fork", "true"], capture_output=True
    )
    return res.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare (UTS/net/PID namespaces)")
def test_two_daemons_as_on_two_hosts_never_double_claim(cluster):
    """Each daemon in its own UTS + network + PID namespace: hostnames ``host-a`` and
    ``host-b``, both PID 1 (so the default worker ids ``host-a:1``/``host-b:1`` differ only
    by host), no network but their own loopback: the server is reached through its Unix
    socket in ``/var/run/postgresql``."""
    name = cluster.url.rpartition("/")[2]
    socket_url = f"postgresql+psycopg://postgres:{PASSWORD}@/{name}?host=/var/run/postgresql"
    for host in ("host-a", "host-b"):
        inner = " ".join(f"'{a}'" for a in cluster.daemon_argv(url=socket_url, worker_id=None))
        cluster.start(
            host,
            [
                "unshare",
                "--uts",
                "--net",
                "--pid",
                "--fork",
                "sh",
                "-c",
                f"hostname {host} && exec {inner}",
            ],
        )
    codes = cluster.wait_all()
    assert codes == {"host-a": 0, "host-b": 0}, {n: cluster.log_text(n) for n in codes}
    figures = cluster.check_exactly_once()
    assert figures["outcomes"] == {"moved": 2 * N}, figures
    assert figures["reruns"] == 0
    assert figures["movers"] == {"host-a:1", "host-b:1"}
    hosts = {w["id"]: (w["host"], w["pid"]) for w in list_workers(cluster.engine)}
    assert hosts == {"host-a:1": ("host-a", 1), "host-b:1": ("host-b", 1)}
