"""A daemon with files, tail and clock sensors survives a PostgreSQL outage.

The shared server stays up: the daemon reaches its own fresh database through a TCP proxy
the test cuts (every connection closed, new ones refused) for longer than several lease
periods, then restores. Files and log lines added during and after the outage are acted
on (the handler ran), each exactly once, within 5 s of the return; the clock ticks again;
stderr holds no traceback; a SIGTERM then stops the daemon cleanly (exit 0).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from runner.store.db import make_engine
from tests.support.fault import flowrun_cmd, poll
from tests.support.metrics import scrape
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

LEASE = 2.0
OUTAGE = 5 * LEASE  # longer than several lease periods

FLOW = """\
flow: watch
initial: work
states:
  work: {call: "watch_handlers:work", next: done}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.txt", settle: 50ms}}
  app: {tail: {path: logs/app.log, match: 'JOB (?P<job>\\w+)'}}
  tick: {every: 1s}
rules:
  - when: inbox
    start: watch
    data: {key: "file:{event.name}"}
  - when: app
    start: watch
    data: {key: "line:{event.job}"}
  - when: tick
    start: watch
    data: {key: "tick:{event.tick}"}
"""

HANDLERS = """\
import time


def work(ctx):
    ctx.data["ran_at"] = time.time()
    return True
"""


def _ran(engine) -> dict[str, list[float]]:
    """``key`` -> handler start times of completed instances (one per instance)."""
    out: dict[str, list[float]] = {}
    with engine.connect() as conn:
        for (data,) in conn.execute(text("SELECT data FROM instances WHERE status='completed'")):
            d = json.loads(data) if isinstance(data, str) else data
            out.setdefault(d["key"], []).append(d["ran_at"])
    return out


def _scrape(logfile: Path) -> dict:
    return scrape(re.search(r"metrics on (http://\S+)", logfile.read_text()).group(1))


def test_sensors_and_rules_resume_after_an_outage(pg_url: str, tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    (flows / "inbox").mkdir(parents=True)
    (flows / "logs").mkdir()
    (flows / "watch.yaml").write_text(FLOW)
    (flows / "watch_handlers.py").write_text(HANDLERS)
    applog = flows / "logs" / "app.log"
    applog.write_text("")
    proxy, via_proxy = TcpProxy.to_url(pg_url)
    engine = make_engine(pg_url)  # the test's own view, never cut
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    logfile = tmp_path / "daemon.log"
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [*flowrun_cmd(), "--flows", str(flows), "--db", via_proxy, "--lease", f"{LEASE:g}"]
            + ["--daemon", "--worker-id", "outage", "--metrics", "127.0.0.1:0"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        poll(lambda: "sensors ready" in logfile.read_text(), 60, what="daemon ready")

        def add(name: str) -> None:
            (flows / "inbox" / f"{name}.txt").write_text(name)
            with applog.open("a") as f:
                f.write(f"JOB {name}\n")

        add("before")
        poll(lambda: {"file:before.txt", "line:before"} <= set(_ran(engine)), 60, what="before")

        proxy.cut()
        cut_at = time.time()
        poll(lambda: "database unavailable" in logfile.read_text(), 30, what="outage noticed")
        time.sleep(1.0)
        add("during")
        time.sleep(max(0.0, cut_at + OUTAGE - time.time()))
        assert proc.poll() is None, logfile.read_text()

        proxy.restore()
        back_at = time.time()
        add("after")
        want = {f"{kind}:{n}" for n in ("during", "after") for kind in ("line",)}
        want |= {f"file:{n}.txt" for n in ("during", "after")}
        ran = poll(lambda: (r := _ran(engine)) and want <= set(r) and r, 60, what="resumed")
        for key in want:
            assert len(ran[key]) == 1, (key, ran[key])
            assert ran[key][0] - back_at <= 5.0, (key, ran[key][0] - back_at)
        # every file and line was acted on exactly once, before, during and after
        ran = _ran(engine)
        assert all(len(v) == 1 for k, v in ran.items() if not k.startswith("tick:")), ran
        with engine.connect() as conn:
            doubled = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT sensor, key FROM events GROUP BY sensor, key "
                    "HAVING count(*) > 1) d"
                )
            ).scalar()
        assert doubled == 0
        # the clock ticks again after the return
        poll(
            lambda: any(min(v) > back_at for k, v in _ran(engine).items() if k.startswith("tick:")),
            30,
            what="a clock tick after the outage",
        )
        # the outage shows in the metrics; every part is up again (a part that failed
        # during the outage may still be in its restart backoff, up to 2 s: wait for it)
        metrics = _scrape(logfile)
        assert metrics[("flowrun_database_disconnects_total", ())] > 0
        assert metrics[("flowrun_database_errors_total", (("part", "rules"),))] > 0

        def parts_down() -> list:
            m = _scrape(logfile)
            return [k for k, v in m.items() if k[0] == "flowrun_part_up" and v != 1]

        poll(lambda: not parts_down(), 30, what="every part up again")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proxy.close()
        engine.dispose()
    log = logfile.read_text()
    assert "Traceback" not in log, log
    assert "stopped:" not in log, log
