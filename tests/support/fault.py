"""Helpers shared by the fault-model tests: real flow files, real SQLite files,
real ``flowrun`` processes. Nothing here is mocked; every wait polls with a generous
deadline instead of asserting on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.compiler import load_flow
from runner.flowspec.policy import Backoff, Policy
from runner.store.create import create_instance
from runner.store.db import make_engine

ROOT = Path(__file__).resolve().parents[2]
_unique = itertools.count()


def unique(prefix: str) -> str:
    """A module/flow name unique within this test process (``call`` modules are cached
    in ``sys.modules`` by name, so every test writes its handlers under a fresh one)."""
    return f"{prefix}_{os.getpid()}_{next(_unique)}"


def policy(max_restarts: int = 1, **values: Any) -> Policy:
    """A state ``Policy`` with ``max_restarts`` (and any other ``values``) given, the rest
    small plain numbers: for ``leases.recover_lost`` and the ``runner.flowspec.faults``
    rules without a flow file."""
    base = {
        "try_interval": 5.0,
        "timeout": None,
        "keepalive": None,
        "max_errors": 3,
        "window": 3600.0,
        "on_exhausted": "failed",
        "backoff": Backoff(10.0, 2.0, 60.0, "none"),
    }
    return Policy(**{**base, "max_restarts": max_restarts, **values})


def write_flow(folder: Path, name: str, body: str, modules: dict[str, str] | None = None) -> Path:
    """Write ``<folder>/<name>.yaml`` (``body`` is everything after ``flow: name``) and
    the given Python modules (``{module name: source}``) next to it."""
    folder.mkdir(parents=True, exist_ok=True)
    for mod, source in (modules or {}).items():
        (folder / f"{mod}.py").write_text(source)
    path = folder / f"{name}.yaml"
    # a unique comment gives each test its own version hash (versions.compiled caches
    # compiled flows per process by hash)
    path.write_text(f"# {unique('test')}\nflow: {name}\n{body}")
    return path


def engine_at(tmp: Path) -> Engine:
    """A real SQLite file engine in ``tmp`` (tables created)."""
    return make_engine(db_url(tmp))


def flow_world(tmp: Path, name: str, body: str) -> tuple[Engine, CompiledFlow]:
    """A real SQLite file engine in ``tmp`` and flow ``name`` (``body`` as for
    :func:`write_flow`) compiled from ``tmp/flows``."""
    return engine_at(tmp), load(write_flow(tmp / "flows", name, body))


def either_world(request: Any, tmp: Path, name: str, body: str) -> tuple[Engine, CompiledFlow]:
    """:func:`flow_world`, on a fresh PostgreSQL database instead when ``request.param``
    (a fixture's) is ``"postgres"`` (the ``pg_url`` fixture); the caller disposes it."""
    if request.param != "postgres":
        return flow_world(tmp, name, body)
    engine = make_engine(request.getfixturevalue("pg_url"))
    return engine, load(write_flow(tmp / "flows", name, body))


def db_url(tmp: Path) -> str:
    """The SQLite URL the tests use inside ``tmp``."""
    return f"sqlite:///{tmp / 'flowrun.db'}"


def new_instance(engine: Engine, flow: CompiledFlow, data: dict | None = None) -> int:
    """Create one instance of ``flow`` (its version stored) and return its id."""
    with engine.begin() as conn:
        return create_instance(conn, flow, data)


def load(path: Path) -> CompiledFlow:
    """Compile a flow file (also seeds nothing: callers store versions via create)."""
    return load_flow(path)


def row(engine: Engine, instance_id: int) -> dict[str, Any]:
    """The instance row as a dict (JSON columns decoded)."""
    with engine.connect() as conn:
        r = (
            conn.execute(text("SELECT * FROM instances WHERE id = :i"), {"i": instance_id})
            .mappings()
            .one()
        )
    out = dict(r)
    for k in ("data", "state_errors"):
        if isinstance(out[k], str):
            out[k] = json.loads(out[k])
    return out


def attempts_of(engine: Engine, instance_id: int) -> list[dict[str, Any]]:
    """The attempt rows of one instance, oldest first."""
    with engine.connect() as conn:
        rs = conn.execute(
            text("SELECT * FROM attempts WHERE instance_id = :i ORDER BY attempt"),
            {"i": instance_id},
        ).mappings()
        out = [dict(r) for r in rs]
    for a in out:
        if isinstance(a["checkpoint"], str):
            a["checkpoint"] = json.loads(a["checkpoint"])
    return out


def sql(engine: Engine, statement: str, **params: Any) -> list[tuple]:
    """Run one statement and return its rows (for writes, in its own transaction)."""
    with engine.begin() as conn:
        res = conn.execute(text(statement), params)
        return list(res) if res.returns_rows else []


def poll(pred: Callable[[], Any], timeout: float = 60.0, every: float = 0.1, what: str = "") -> Any:
    """Call ``pred`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not met within {timeout}s: {what or pred}")
        time.sleep(every)


def wait_completed(engine: Engine, n: int, timeout: float, what: str = "") -> None:
    """Poll (every 0.5 s) until at least ``n`` instances are ``completed``; fail after
    ``timeout`` seconds, naming ``what``."""
    poll(
        lambda: sql(engine, "SELECT count(*) FROM instances WHERE status = 'completed'")[0][0] >= n,
        timeout=timeout,
        every=0.5,
        what=what or f"{n} instances completed",
    )


async def until(pred: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """On a running loop: await until ``pred()`` is truthy (polled every 20 ms); fail
    after ``timeout`` seconds, naming ``what``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not met within {timeout}s: {what}")
        await asyncio.sleep(0.02)


def pid_alive(pid: int) -> bool:
    """True while a process with ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone between the open and the read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    """True while any process of the process group ``pgid`` lives (zombies excluded)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def flowrun_cmd() -> list[str]:
    """The console script next to this interpreter, else ``python -m runner.cli``."""
    script = Path(sys.executable).parent / "flowrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runner.cli"]


class Flowrun:
    """Runs ``flowrun`` against ``home/flows`` and ``home/flowrun.db``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.flows = home / "flows"
        self.db = db_url(home)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.env = env

    def argv(self, *args: str, lease: float | None = None) -> list[str]:
        """The full command line of ``flowrun ARGS``."""
        extra = ["--lease", f"{lease:g}"] if lease is not None else []
        return [*flowrun_cmd(), "--flows", str(self.flows), "--db", self.db, *extra, *args]

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def daemon(
        self, *args: str, lease: float = 60.0, worker_id: str | None = None, log: str = "daemon"
    ) -> Daemon:
        """Start ``flowrun --daemon`` in the background (its stderr goes to a log file)."""
        wid = ["--worker-id", worker_id] if worker_id else []
        logfile = self.home / f"{log}.log"
        handle = logfile.open("ab")
        proc = subprocess.Popen(
            self.argv("--daemon", *wid, *args, lease=lease),
            cwd=self.home,
            env=self.env,
            stdout=handle,
            stderr=handle,
        )
        handle.close()
        return Daemon(proc, logfile)

    def show(self, instance_id: int) -> dict[str, Any]:
        """``flowrun show ID --json``."""
        res = self("show", str(instance_id), "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


class Daemon:
    """A running ``flowrun --daemon`` subprocess."""

    def __init__(self, proc: subprocess.Popen, logfile: Path) -> None:
        self.proc = proc
        self.logfile = logfile

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the daemon logged so far."""
        return self.logfile.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the daemon process (only)."""
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the daemon to exit; returns its exit code."""
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Cleanup: SIGCONT (if stopped), SIGKILL, reap. Safe to call twice."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


@contextlib.contextmanager
def daemon_running(fr: Flowrun, name: str, *args: str, **kw: Any) -> Iterator[Daemon]:
    """A ``flowrun --daemon`` of ``fr`` (worker id unique to ``name``; ``args``/``kw`` as
    for :meth:`Flowrun.daemon`) once it logged its start; stopped with SIGINT after."""
    daemon = fr.daemon(*args, worker_id=unique(name), **kw)
    try:
        poll(lambda: "started" in daemon.log(), 60, what="daemon start")
        yield daemon
        daemon.signal(signal.SIGINT)
        daemon.wait(60)
    finally:
        daemon.stop()
