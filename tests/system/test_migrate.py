"""``flowrun migrate`` against a real ``flowrun --daemon`` on a real SQLite file:
instances move to a newer stored version of their flow, states that vanished
are refused unless mapped, a running attempt refuses (``--wait`` waits for it), and every
migration is an audited command row shown by ``show`` and ``explain``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.fault import Daemon, Flowrun, daemon_running, engine_at, poll, row, sql

pytestmark = pytest.mark.timeout(300)

# v1: `hold` waits for an event; `busy` runs until `release.<id>` exists, then `gate`
# waits for another event
V1 = """\
flow: mig
initial: hold
states:
  hold: {external: true, on: {go: busy}}
  busy:
    exec: [sh, -c, 'while [ ! -e "release.$FLOWRUN_INSTANCE" ]; do sleep 0.1; done']
    next: gate
  gate: {external: true, on: {go: done}}
  done: {terminal: true}
"""
# v2: `hold` renamed `waiting`; `gate` leads to a new `extra` step before done
V2 = """\
flow: mig
initial: waiting
states:
  waiting: {external: true, on: {go: busy}}
  busy:
    exec: [sh, -c, 'while [ ! -e "release.$FLOWRUN_INSTANCE" ]; do sleep 0.1; done']
    next: gate
  gate: {external: true, on: {go: extra}}
  extra: {exec: [sh, -c, "exit 0"], next: done}
  done: {terminal: true}
"""


@pytest.fixture
def live(tmp_path) -> Iterator[tuple[Flowrun, Daemon]]:
    fr = Flowrun(tmp_path)
    fr.flows.mkdir()
    (fr.flows / "mig.yaml").write_text(V1)
    with daemon_running(fr, "mig") as daemon:
        yield fr, daemon


def _start(fr: Flowrun) -> int:
    res = fr("start", "mig")
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def test_migrate_refuses_maps_waits_and_audits(live) -> None:
    fr, _ = live
    db = engine_at(fr.home)
    held, running, finished = _start(fr), _start(fr), _start(fr)
    v1 = row(db, held)["version"]
    for iid in (running, finished):
        assert fr("send", str(iid), "go").returncode == 0
    (fr.flows / f"release.{finished}").write_text("")
    poll(lambda: row(db, finished)["state"] == "gate", 60, what="at the gate")
    assert fr("send", str(finished), "go").returncode == 0
    assert row(db, finished)["status"] == "completed"
    poll(lambda: row(db, running)["running_attempt"] is not None, 60, what="running")

    (fr.flows / "mig.yaml").write_text(V2)
    res = fr("migrate", "--flow", "mig", "--to", "latest", "--dry-run")
    assert res.returncode == 1
    assert f"instance {held}: state 'hold' does not exist in version" in res.stderr
    assert "--map hold=NEW" in res.stderr
    assert f"instance {running}: attempt 1 is running" in res.stderr
    assert f"instance {finished}" not in res.stdout + res.stderr  # finished: left alone
    assert sql(db, "SELECT COUNT(*) FROM commands WHERE command = 'migrate'") == [(0,)]

    res = fr("migrate", "--flow", "mig", "--to", "latest", "--map", "hold=waiting", "--dry-run")
    assert res.returncode == 1, res.stderr
    assert f"would migrate instance {held}: version {v1} -> " in res.stdout
    assert row(db, held)["version"] == v1

    res = fr("migrate", "--flow", "mig", "--to", "latest", "--map", "hold=waiting")
    assert res.returncode == 1  # the running one refused
    r = row(db, held)
    v2 = r["version"]
    assert v2 != v1 and (r["state"], r["status"]) == ("waiting", "runnable")
    assert row(db, running)["version"] == v1

    waiter = subprocess.Popen(
        fr.argv("migrate", "--flow", "mig", "--to", v2[:8], "--wait", str(running)),
        cwd=fr.home,
        env=fr.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    (fr.flows / f"release.{running}").write_text("")  # the attempt ends: busy -> gate (v1)
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    assert f"instance {running}: version {v1} -> {v2}" in out
    assert (row(db, running)["state"], row(db, running)["version"]) == ("gate", v2)
    assert fr("send", str(running), "go").returncode == 0  # v2's gate leads to `extra`
    poll(lambda: row(db, running)["status"] == "completed", 60, what="ran on under v2")
    states = sql(db, "SELECT state FROM attempts WHERE instance_id = :i", i=running)
    assert ("extra",) in states  # the step only v2 has

    res = fr("send", str(held), "go")
    assert res.returncode == 0, res.stderr
    show = fr.show(held)
    migrations = [c for c in show["commands"] if c["command"] == "migrate"]
    assert [m["status"] for m in migrations] == ["applied"]
    assert migrations[0]["args"] == {"from": v1, "to": v2, "from_state": "hold", "state": "waiting"}
    explained = json.loads(fr("explain", str(held), "--json").stdout)
    versions = [e for e in explained["timeline"] if e["kind"] == "version"]
    assert (
        len(versions) == 1 and f"version {v1} -> {v2}, state hold -> waiting" in versions[0]["text"]
    )
    assert explained["timeline"][0]["data"]["version"] == v1

    refused = [c for c in fr.show(running)["commands"] if c["command"] == "migrate"]
    assert [c["status"] for c in refused][-1] == "applied" and "refused" in [
        c["status"] for c in refused
    ]

    for args, message in (
        (("--to", "ffffffff"), "no stored version matching 'ffffffff'"),
        (("--to", "latest", "--map", "oops"), "expected OLD=NEW"),
        (("--to", "latest", "--map", "hold=nowhere"), "has no state 'nowhere'"),
    ):
        res = fr("migrate", "--flow", "mig", *args)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
    res = fr("migrate", "--flow", "mig", "--to", "latest", "999")
    assert res.returncode == 1 and "no instance 999 of flow mig" in res.stderr
