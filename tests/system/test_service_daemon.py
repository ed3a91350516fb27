"""``flowrun --daemon`` as a service, against real subprocesses:

- ``/metrics`` scraped over real HTTP and parsed with prometheus_client's parser;
- systemd notification received on a real ``AF_UNIX`` datagram socket (``NOTIFY_SOCKET``);
- JSON log lines with the attempt fields as keys, start-up errors included;
- exit codes: 0 after a clean stop, 143 after an abort by a second SIGTERM, 2 for bad flows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runner.engine.config import default_concurrency
from runner.flowspec.compiler import load_flow
from runner.store.create import create_instances
from runner.store.db import make_engine
from tests.support.fault import flowrun_cmd, poll

pytestmark = pytest.mark.timeout(240)

N = 6

FLOW = """\
flow: svc
initial: work
states:
  work: {call: "svc_handlers:work", next: done}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.txt", settle: 50ms}}
rules:
  - when: inbox
    start: svc
    data: {name: "{event.name}"}
"""

#: quick instances run by one daemon with a progress line (test_progress_total_...)
INSTANCES_TO_RUN = 3000

SLOW_FLOW = """\
flow: slow
initial: work
states:
  work: {call: "svc_handlers:slow", next: done}
  done: {terminal: true}
"""

HANDLERS = """\
import asyncio


def work(ctx):
    return True


async def slow(ctx):
    await asyncio.sleep(60)
    return True
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLOWRUN_", "NOTIFY_"))}
    env.pop("WATCHDOG_USEC", None)
    env.update(extra)
    return env


def _home(tmp: Path, flow: str = FLOW) -> Path:
    flows = tmp / "flows"
    (flows / "inbox").mkdir(parents=True)
    (flows / "svc.yaml").write_text(flow)
    (flows / "svc_handlers.py").write_text(HANDLERS)
    return flows


def _start(tmp: Path, *args: str, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    logfile = tmp / "daemon.log"
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [*flowrun_cmd(), "--flows", str(tmp / "flows"), "--db", f"sqlite:///{tmp}/f.db"]
            + ["--daemon", "--worker-id", "svc", *args],
            cwd=tmp,
            env=env,
            stdout=out,
            stderr=out,
        )
    return proc, logfile


class Live:
    """One daemon for the module: metrics on a free port, notify socket, JSON logs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        _home(tmp)
        self.sock_path = str(tmp / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.sock_path)
        self.sock.settimeout(0.2)
        self.notes: list[str] = []
        env = _env(NOTIFY_SOCKET=self.sock_path, WATCHDOG_USEC="2000000")
        self.proc, self.logfile = _start(
            tmp, "--metrics", "127.0.0.1:0", "--log-format", "json", "--log-attempts", env=env
        )

    def lines(self) -> list[str]:
        return [ln for ln in self.logfile.read_text().splitlines() if ln.strip()]

    def records(self) -> list[dict]:
        return [json.loads(ln) for ln in self.lines()]

    def receive(self) -> list[str]:
        """Every notification received so far (drains the socket)."""
        while True:
            try:
                self.notes.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return self.notes

    def url(self) -> str:
        msg = poll(
            lambda: next((r["msg"] for r in self.records() if "metrics on" in r["msg"]), None),
            60,
            what="metrics address logged",
        )
        return re.search(r"(http://\S+)", msg).group(1)

    def scrape(self) -> dict[str, object]:
        """``{sample name + sorted labels: value}`` of one real HTTP scrape."""
        with urllib.request.urlopen(self.url(), timeout=10) as resp:
            body = resp.read().decode()
        out = {}
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Live:
    daemon = Live(tmp_path_factory.mktemp("svc"))
    try:
        poll(lambda: any("sensors ready" in r["msg"] for r in daemon.records()), 60, what="ready")
        for i in range(N):
            (daemon.tmp / "flows" / "inbox" / f"f{i}.txt").write_text(str(i))
        poll(lambda: sum("moved" in r["msg"] for r in daemon.records()) >= N, 60)
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(30)
        daemon.sock.close()


def test_metrics_scraped_over_http(live: Live) -> None:
    def done() -> dict | None:
        m = live.scrape()
        key = ("flowrun_instances", (("flow", "svc"), ("status", "completed")))
        # the worker counts a cycle's commits once the cycle is back on its loop: the
        # instances (read from the table) may be completed a moment before
        committed = m.get(("flowrun_committed_attempts_total", ()), 0)
        return m if m.get(key) == N and committed >= N else None

    m = poll(done, 30, every=0.5, what="instance counts refreshed")
    attempts = (
        "flowrun_attempts_total",
        (("flow", "svc"), ("outcome", "moved"), ("state", "work")),
    )
    assert m[attempts] == N
    assert m[("flowrun_attempt_duration_seconds_count", (("flow", "svc"), ("state", "work")))] == N
    assert m[("flowrun_claims_total", ())] >= N
    assert m[("flowrun_committed_attempts_total", ())] >= N
    assert m[("flowrun_fenced_out_commits_total", ())] == 0
    assert m[("flowrun_sensor_events_total", (("sensor", "svc.inbox"),))] == N
    assert m[("flowrun_rule_actions_total", (("sensor", "svc.inbox"),))] == N
    assert m[("flowrun_running_attempts", ())] == 0
    assert m[("flowrun_free_slots", ())] == default_concurrency()  # all free
    assert m[("flowrun_event_start_latency_seconds_count", ())] == N
    assert m[("flowrun_database_disconnects_total", ())] == 0
    assert m[("flowrun_database_errors_total", (("part", "rules"),))] == 0
    assert m[("flowrun_part_up", (("part", "worker"),))] == 1
    assert m[("flowrun_part_up", (("part", "sensor svc.inbox"),))] == 1


def test_json_lines_carry_attempt_fields(live: Live) -> None:
    records = live.records()  # every line parses as JSON
    attempts = [r for r in records if r["logger"] == "flowrun.attempts"]
    assert len(attempts) == N
    for r in attempts:
        assert {"instance", "flow", "state", "attempt", "worker", "outcome"} <= set(r)
        assert (r["flow"], r["state"], r["worker"], r["outcome"]) == ("svc", "work", "svc", "moved")


def test_systemd_notifications(live: Live) -> None:
    poll(lambda: sum("WATCHDOG=1" in n for n in live.receive()) >= 2, 30, what="watchdog pings")
    notes = live.receive()
    ready = [n for n in notes if "READY=1" in n]
    assert len(ready) == 1 and "STATUS=running" in ready[0]
    assert notes.index(ready[0]) < max(i for i, n in enumerate(notes) if "WATCHDOG=1" in n)


def test_clean_stop_notifies_and_exits_0(live: Live) -> None:
    live.proc.send_signal(signal.SIGTERM)
    assert live.proc.wait(60) == 0
    assert any("STOPPING=1" in n for n in live.receive())
    assert "Traceback" not in live.logfile.read_text()


def test_second_sigterm_aborts_with_143(tmp_path: Path) -> None:
    flows = _home(tmp_path, SLOW_FLOW)
    (flows / "svc.yaml").rename(flows / "slow.yaml")
    proc, logfile = _start(tmp_path, "--grace", "60", env=_env())
    try:
        poll(lambda: "started" in logfile.read_text(), 60, what="daemon start")
        res = subprocess.run(
            [*flowrun_cmd(), "--flows", str(flows), "--db", f"sqlite:///{tmp_path}/f.db"]
            + ["start", "slow"],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        poll(lambda: "running 1" in _status(tmp_path), 60, what="attempt running")
        proc.send_signal(signal.SIGTERM)
        poll(lambda: "stopping gracefully" in logfile.read_text(), 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _status(tmp: Path) -> str:
    res = subprocess.run(
        [*flowrun_cmd(), "--flows", str(tmp / "flows"), "--db", f"sqlite:///{tmp}/f.db"]
        + ["workers", "--json"],
        cwd=tmp,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    workers = json.loads(res.stdout or "[]")
    return " ".join(f"running {w.get('running')}" for w in workers)


def test_bad_flow_is_json_too_and_exits_2(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "bad.yaml").write_text("flow: bad\ninitial: nowhere\nstates: {}\n")
    proc, logfile = _start(tmp_path, "--log-format", "json", env=_env())
    assert proc.wait(60) == 2
    lines = [ln for ln in logfile.read_text().splitlines() if ln.strip()]
    assert lines
    records = [json.loads(ln) for ln in lines]  # every line is JSON
    assert any(r["level"] == "error" and "bad.yaml" in r["msg"] for r in records), records


def test_exit_when_idle_without_a_terminal_prints_progress_lines(tmp_path: Path) -> None:
    flows = _home(tmp_path, SLOW_FLOW.replace("slow", "nap"))
    (flows / "svc.yaml").rename(flows / "nap.yaml")
    (flows / "svc_handlers.py").write_text(
        "import asyncio\n\n\nasync def nap(ctx):\n    await asyncio.sleep(1)\n    return True\n"
    )
    db = ["--flows", str(flows), "--db", f"sqlite:///{tmp_path}/f.db"]
    for _ in range(12):
        res = subprocess.run(
            [*flowrun_cmd(), *db, "start", "nap"], env=_env(), capture_output=True, timeout=60
        )
        assert res.returncode == 0, res.stderr
    proc, logfile = _start(tmp_path, "--exit-when-idle", "--concurrency", "2", env=_env())
    assert proc.wait(120) == 0
    lines = re.findall(r"progress: (\d+)/12 done, [\d.]+/s, ETA \S+", logfile.read_text())
    assert lines, logfile.read_text()  # 12 one-second jobs two at a time: at least one line
    assert int(lines[0]) < 12


def test_progress_total_is_every_instance_to_run(tmp_path: Path) -> None:
    """Quick attempts finish during the daemon's first cycles, before the progress line
    starts: they count as done all the same (the total once ended at 49984 of 50,000).
    Instances that were final before the daemon started count in neither figure."""
    flows = _home(tmp_path)
    (flows / "svc.yaml").write_text(FLOW.split("sensors:")[0])  # no sensor: quick work only
    engine = make_engine(f"sqlite:///{tmp_path}/f.db")
    flow = load_flow(flows / "svc.yaml")
    with engine.begin() as conn:  # final before the daemon starts: not its progress
        create_instances(conn, flow, [{"old": i} for i in range(30)])
    proc, _ = _start(tmp_path, "--exit-when-idle", env=_env())
    assert proc.wait(120) == 0
    with engine.begin() as conn:
        create_instances(conn, flow, [{"i": i} for i in range(INSTANCES_TO_RUN)])
    engine.dispose()
    proc, logfile = _start(tmp_path, "--exit-when-idle", env=_env())
    assert proc.wait(120) == 0, logfile.read_text()
    lines = re.findall(r"progress: (\d+)/(\d+) done", logfile.read_text())
    assert lines[-1] == (str(INSTANCES_TO_RUN), str(INSTANCES_TO_RUN)), logfile.read_text()
