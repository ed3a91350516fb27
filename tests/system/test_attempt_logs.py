"""Attempt logs end to end (issue 29): real daemons, real handlers, `flowrun logs`.

Every wait polls a condition with a deadline; nothing is timed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.store.db import make_engine
from tests.support.fault import Flowrun, daemon_running, engine_at, poll, sql, unique, write_flow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

INTERLEAVED = r"""
import sys, time
time.sleep(0.2)  # past the first 50 ms: the pipes are read as data comes
for i in range(4):
    print(f"out {i}", flush=True)
    time.sleep(0.05)
    print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.05)
print("\x1b[31mred\x1b[0m \x07", flush=True)
sys.exit(3)
"""

WAITER = r"""
import os, sys, time
print("first", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("last", flush=True)
"""


def _flow(fr: Flowrun, name: str, script: str, *args: str, extra: str = "") -> None:
    (fr.flows).mkdir(parents=True, exist_ok=True)
    (fr.flows / f"{name}.py").write_text(script)
    argv = json.dumps(["python", f"{name}.py", *args])
    body = f"""\
initial: a
states:
  a:
    exec: {argv}
    next: done
    error_budget: {{max_errors: 1}}
{extra}  done:
    terminal: true
"""
    write_flow(fr.flows, name, body)


def _start(fr: Flowrun, name: str) -> int:
    res = fr("start", name)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def _waiting(tmp_path: Path, prefix: str, script: str):
    """A flow running ``script`` (which waits for the file ``go``), one instance started:
    ``(fr, go, instance id, engine)``."""
    fr = Flowrun(tmp_path)
    name = unique(prefix)
    go = tmp_path / "go"
    _flow(fr, name, script, str(go))
    return fr, go, _start(fr, name), engine_at(tmp_path)


def _drain(fr: Flowrun) -> None:
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr


def test_interleaved_order_escapes_and_raw(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    name = unique("inter")
    _flow(fr, name, INTERLEAVED)
    iid = _start(fr, name)
    _drain(fr)
    res = fr("logs", str(iid), "--json")
    assert res.returncode == 0, res.stderr
    text = "".join(json.loads(line)["text"] for line in res.stdout.splitlines())
    lines = text.splitlines()
    assert lines[:8] == [f"{s} {i}" for i in range(4) for s in ("out", "err")]
    shown = fr("logs", str(iid))
    assert "\\x1b[31mred\\x1b[0m \\x07" in shown.stdout and "\x1b" not in shown.stdout
    raw = subprocess.run(fr.argv("logs", str(iid), "--raw"), env=fr.env, capture_output=True)
    assert b"\x1b[31mred\x1b[0m \x07\n" in raw.stdout
    errs = fr("logs", str(iid), "--stream", "stderr", "--timestamps").stdout.splitlines()
    assert len(errs) == 4 and all(e.endswith(f"err {i}") for i, e in enumerate(errs))
    assert errs[0][:4].isdigit() and "Z err 0" in errs[0]
    assert fr("logs", str(iid), "--tail", "1").stdout.strip() == "\\x1b[31mred\\x1b[0m \\x07"
    assert fr("logs", str(iid), "--attempt", "2").returncode == 1
    assert fr("logs", str(iid + 1)).returncode == 1
    assert fr("logs", str(iid), "--state", "nope").returncode == 1


CAPPED = r"""
import sys
for i in range(200000):
    sys.stdout.write(f"line {i:07d}\n")
"""


def test_cap_keeps_head_and_tail_with_a_marker(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    name = unique("cap")
    _flow(fr, name, CAPPED, extra="    log_max: 1MiB\n")
    iid = _start(fr, name)
    _drain(fr)
    whole = "".join(f"line {i:07d}\n" for i in range(200000)).encode()  # 2.6 MB
    raw = subprocess.run(fr.argv("logs", str(iid), "--raw"), env=fr.env, capture_output=True)
    assert raw.returncode == 0
    out = raw.stdout
    head = 512 << 10  # half of a log_max under 2 MiB
    assert out[:head] == whole[:head]
    assert whole.endswith(out[head:]) and len(out) > head
    dropped = len(whole) - len(out)
    assert f"{dropped} bytes dropped".encode() in raw.stderr
    assert len(out) <= 1 << 20
    shown = fr("logs", str(iid)).stdout
    assert f"[flowrun: {dropped} bytes dropped here" in shown
    assert shown.endswith("line 0199999\n")


def test_follow_shows_a_running_handler_and_ends_with_it(tmp_path: Path) -> None:
    fr, go, iid, engine = _waiting(tmp_path, "follow", WAITER)
    with daemon_running(fr, "follow"):
        poll(
            lambda: sql(engine, "SELECT count(*) FROM attempt_logs WHERE instance_id = :i", i=iid)[
                0
            ][0],
            60,
            what="first output stored",
        )
        follower = subprocess.Popen(
            fr.argv("logs", str(iid), "-f"), env=fr.env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert follower.stdout.readline() == "first\n"  # while the handler still runs
            go.write_text("")
            assert follower.stdout.readline() == "last\n"
            assert follower.wait(60) == 0
        finally:
            follower.kill()
            follower.wait()
    assert fr("show", str(iid)).returncode == 0


SILENT = r"""
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_follow_of_a_silent_attempt_ends_with_it(tmp_path: Path) -> None:
    """An attempt that writes nothing stores no log row at all: its attempt row's
    ``log_bytes`` (0) is what ends a follower."""
    fr, go, iid, engine = _waiting(tmp_path, "silent", SILENT)
    q = "SELECT running_attempt FROM instances WHERE id = :i"
    with daemon_running(fr, "silent"):
        poll(lambda: sql(engine, q, i=iid)[0][0], 60, what="the attempt running")
        follower = subprocess.Popen(
            fr.argv("logs", str(iid), "-f"), env=fr.env, stdout=subprocess.PIPE, text=True
        )
        try:
            go.write_text("")
            assert follower.wait(60) == 0
            assert follower.stdout.read() == ""
        finally:
            follower.kill()
            follower.wait()
    rows = sql(engine, "SELECT outcome, log_bytes FROM attempts WHERE instance_id = :i", i=iid)
    assert rows == [("moved", 0)]
    assert sql(engine, "SELECT count(*) FROM attempt_logs WHERE instance_id = :i", i=iid) == [(0,)]


def test_a_sigkilled_daemons_attempt_keeps_what_was_stored(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    name = unique("killed")
    go = tmp_path / "go"
    _flow(fr, name, WAITER, str(go), extra="    max_restarts: 3\n")
    iid = _start(fr, name)
    engine = engine_at(tmp_path)
    daemon = fr.daemon(worker_id=unique("victim"), lease=2.0)
    try:
        poll(
            lambda: sql(engine, "SELECT count(*) FROM attempt_logs WHERE instance_id = :i", i=iid)[
                0
            ][0],
            60,
            what="first output stored",
        )
        daemon.signal(signal.SIGKILL)
        daemon.wait(30)
    finally:
        go.write_text("")  # the orphaned handler ends, and so will the next attempt
        daemon.stop()
    res = fr("logs", str(iid))
    assert res.returncode == 0 and res.stdout == "first\n", res
    # another daemon records the attempt lost and runs the next one
    res = fr("--lease", "2", "--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    outcomes = sql(
        engine, "SELECT attempt, outcome FROM attempts WHERE instance_id = :i ORDER BY 1", i=iid
    )
    assert outcomes == [(1, "lost"), (2, "moved")]
    assert fr("logs", str(iid), "--attempt", "1").stdout == "first\n"
    assert fr("logs", str(iid)).stdout == "first\nlast\n"


CALLS = """
import asyncio, logging

async def chatty(ctx):
    for i in range(5):
        print(f"print {ctx.data['who']} {i}")
        ctx.log.info("log %s %d", ctx.data["who"], i)
        logging.getLogger("some.library").warning("lib %s %d", ctx.data["who"], i)
        await asyncio.sleep(0.01)
    return True

def blocking(ctx):
    print(f"sync {ctx.data['who']} token={ctx.secrets['TOKEN']}")
    ctx.log.warning("sync log %s", ctx.data["who"])
    return True
"""


def test_call_handlers_output_goes_to_their_own_attempt(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    name = unique("calls")
    mod = unique("callmod")
    body = f"""\
initial: a
states:
  a: {{call: "{mod}:chatty", next: b}}
  b: {{call: "{mod}:blocking", next: done, secrets: {{TOKEN: {{file: token.txt}}}}}}
  done: {{terminal: true}}
"""
    write_flow(fr.flows, name, body, {mod: CALLS})
    (fr.flows / "token.txt").write_text("s3cr3t-value")
    ids = []
    for who in ("x", "y", "z"):
        res = fr("start", name, f"who={who}")
        assert res.returncode == 0, res.stderr
        ids.append(int(res.stdout))
    _drain(fr)
    for iid, who in zip(ids, ("x", "y", "z"), strict=True):
        first = fr("logs", str(iid), "--attempt", "1", "--json").stdout.splitlines()
        chunks = [json.loads(line) for line in first]
        text = "".join(c["text"] for c in chunks)
        assert [f"print {who} {i}" in text for i in range(5)] == [True] * 5
        assert f"INFO flowrun.handler.{name}.a: log {who} 4" in text
        assert f"WARNING some.library: lib {who} 4" in text
        others = {"x", "y", "z"} - {who}
        assert not any(f" {o} " in text for o in others), text
        out = {c["stream"] for c in chunks if "print" in c["text"]}
        assert out == {"stdout"}
        second = fr("logs", str(iid), "--state", "b").stdout
        assert f"sync {who} token=***\n" in second and f"sync log {who}" in second
        assert "s3cr3t" not in second


@pytest.mark.postgres
def test_a_log_is_read_from_another_host_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    hosts = [Flowrun(tmp_path / f"host{i}") for i in range(3)]
    name = unique("fleet")
    for fr in hosts:
        fr.db = pg_url
        _flow(fr, name, "import os\nprint('ran in', os.getcwd())\n")
    ids = [_start(hosts[0], name) for _ in range(6)]
    daemons = [fr.daemon(worker_id=unique(f"pg{i}")) for i, fr in enumerate(hosts[:2])]
    try:
        for iid in ids:
            poll(
                lambda iid=iid: hosts[2]("show", str(iid), "--json").stdout.count('"completed"'),
                120,
                what="completed",
            )
    finally:
        for d in daemons:
            d.signal(signal.SIGINT)
        for d in daemons:
            d.wait(60)
            d.stop()
    seen = set()
    for iid in ids:  # read by a third process in a third folder
        res = hosts[2]("logs", str(iid))
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("ran in ")
        seen.add(Path(res.stdout.split(" ", 2)[2].strip()).parent.name)
    assert seen <= {"host0", "host1"} and seen
    # each outcome's batch commit stored the bytes its handler wrote
    engine = make_engine(pg_url)
    q = "SELECT log_bytes FROM attempts WHERE instance_id = :i"
    assert all(sql(engine, q, i=iid)[0][0] > len("ran in \n") for iid in ids)


def test_logs_help_lists_its_options() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "runner.cli", "logs", "--help"], capture_output=True, text=True
    )
    for opt in ("--attempt", "--state", "--stream", "--follow", "--follow-next", "--tail"):
        assert opt in res.stdout


def test_follow_next_follows_the_next_attempts_until_the_instance_ends(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    name = unique("next")
    go = tmp_path / "go"
    fr.flows.mkdir(parents=True, exist_ok=True)
    (fr.flows / f"{name}.py").write_text(WAITER)
    body = f"""\
initial: a
states:
  a:
    exec: {json.dumps(["python", f"{name}.py", str(go)])}
    next: b
  b:
    exec: [python, -c, "print('second')"]
    next: done
  done:
    terminal: true
"""
    write_flow(fr.flows, name, body)
    iid = _start(fr, name)
    follower = subprocess.Popen(
        fr.argv("logs", str(iid), "--follow-next"), env=fr.env, stdout=subprocess.PIPE, text=True
    )
    try:
        with daemon_running(fr, "next"):
            assert follower.stdout.readline() == "first\n"
            go.write_text("")
            assert follower.stdout.readline() == "last\n"
            assert follower.stdout.readline() == "second\n"
            assert follower.wait(60) == 0
    finally:
        follower.kill()
        follower.wait()
