"""Deadlines under a real daemon on a real SQLite file (issue 30 item 3): an external
state's deadline moves it on time with one ``deadline_missed`` event; ``then: alert``
emits once and moves nothing; the flow's deadline counts from the start across "not yet"
answers; a paused instance still misses its deadline; each is one WARNING line;
``explain`` says what is coming and what happened."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.flowspec.compiler import load_flow
from runner.ops import commands
from runner.store.create import create_instance
from runner.store.db import make_engine
from tests.support.fault import Flowrun, daemon_running, poll, sql, write_flow

pytestmark = pytest.mark.timeout(300)

WAIT = """\
initial: wait
states:
  wait:
    external: true
    on: {ok: done}
    deadline: {after: 2s, then: escalate}
  escalate:
    external: true
    on: {ok: done}
  done: {terminal: true}
sensors:
  late: {lifecycle: {on: [deadline_missed]}}
"""

ALERT = """\
initial: wait
states:
  wait:
    external: true
    on: {ok: done}
    deadline: {after: 1s, then: alert}
  done: {terminal: true}
"""

MOVE = """\
initial: go
states:
  go: {exec: [python, -c, "pass"], next: wait}
  wait:
    external: true
    on: {ok: done}
    deadline: {after: 2s, then: alert}
  done: {terminal: true}
"""

NOT_YET = """\
initial: poll
deadline: {after: 2s, then: failed}
states:
  poll:
    exec: [python, -c, "raise SystemExit(75)"]
    try_interval: 200ms
    next: done
  done: {terminal: true}
"""


def events(engine: Engine, instance: int) -> list[dict]:
    """The ``deadline_missed`` lifecycle events stored for ``instance``."""
    rows = sql(engine, "SELECT payload FROM events WHERE sensor = 'dwait.late'")
    payloads = [p if isinstance(p, dict) else json.loads(p) for (p,) in rows]
    return [p for p in payloads if p["instance"] == instance]


def deadline_rows(engine: Engine, instance: int) -> list[tuple]:
    return sql(
        engine,
        "SELECT created_at, result FROM commands WHERE command = 'deadline' AND instance_id = :i",
        i=instance,
    )


def start(engine: Engine, path: Path) -> int:
    """A new instance of the flow file at ``path`` (the API: a CLI start takes seconds on
    a loaded machine, longer than these deadlines)."""
    with engine.begin() as conn:
        return create_instance(conn, load_flow(path))


def test_deadlines_act_on_time_once(tmp_path) -> None:
    fr = Flowrun(tmp_path)
    paths = {
        name: write_flow(fr.flows, name, body)
        for name, body in (
            ("dwait", WAIT),
            ("dalert", ALERT),
            ("dpoll", NOT_YET),
            ("dlong", WAIT.replace("2s", "1h")),
            ("dmove", MOVE),
        )
    }
    engine = make_engine(fr.db)
    with daemon_running(fr, "dl", "--log-format", "json") as daemon:
        poll(lambda: "sensors ready" in daemon.log(), 60, what="hub ready")
        moving = start(engine, paths["dwait"])
        paused = start(engine, paths["dwait"])
        commands.submit(engine, [paused], "pause")
        alert = start(engine, paths["dalert"])
        polled = start(engine, paths["dpoll"])
        long = start(engine, paths["dlong"])
        moved = start(engine, paths["dmove"])  # its deadline starts when the worker moves it
        ahead = fr("explain", str(long)).stdout
        assert "deadline in 59m" in ahead and "→ escalate" in ahead, ahead

        poll(lambda: fr.show(moving)["state"] == "escalate", 60, what="moved by its deadline")
        shown = fr.show(moving)
        [(acted, text)] = deadline_rows(engine, moving)
        created = sql(engine, "SELECT created_at FROM instances WHERE id = :i", i=moving)[0][0]
        due = created + 2.0
        lag = acted - due
        print(f"deadline acted {lag * 1000:.0f} ms after its time")
        assert acted >= due  # never early
        assert lag < 5.0  # generous on a loaded machine; about LOOK_EVERY (0.5 s) when idle
        assert "state 'wait' deadline (2s after entering it) → escalate" in text
        assert shown["status"] == "runnable" and shown["deadline_at"] is None
        assert fr.show(long)["deadline_at"].endswith("Z")

        poll(lambda: fr.show(paused)["state"] == "escalate", 60, what="paused one moved")
        assert fr.show(paused)["status"] == "paused"  # moved, but stays paused
        poll(lambda: fr.show(polled)["status"] == "failed", 60, what="flow deadline failed it")
        poll(lambda: deadline_rows(engine, alert), 60, what="alert acted on")
        poll(lambda: deadline_rows(engine, moved), 60, what="deadline of a state moved to")
        entered = sql(engine, "SELECT state_changed FROM instances WHERE id = :i", i=moved)[0][0]
        assert deadline_rows(engine, moved)[0][0] >= entered + 2.0
        time.sleep(2.0)  # four looks later: the alert was not acted on again
        assert len(deadline_rows(engine, alert)) == 1
        assert fr.show(alert)["state"] == "wait" and fr.show(alert)["status"] == "runnable"
        assert [e["kind"] for e in events(engine, moving)] == ["deadline_missed"]
        assert [e["state"] for e in events(engine, moving)] == ["escalate"]
        assert len(events(engine, paused)) == 1
        after = fr("explain", str(moving)).stdout
        assert "deadline missed at" in after and "→ escalate" in after, after
        records = [json.loads(x) for x in daemon.log().splitlines() if x.startswith("{")]
    warned = [r for r in records if r.get("kind") == "deadline_missed"]
    assert sorted(r["instance"] for r in warned) == sorted([moving, paused, alert, polled, moved])
    by_id = {r["instance"]: r for r in warned}
    assert (by_id[polled]["flow"], by_id[polled]["state"]) == ("dpoll", "poll")
    assert by_id[moving]["level"] == "warning"
    failed = sql(engine, "SELECT status, deadline_at FROM instances WHERE id = :i", i=polled)
    assert failed == [("failed", None)]


def test_pending_deadline_does_not_keep_exit_when_idle_running(tmp_path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "dwait", WAIT.replace("2s", "1h"))
    int(fr("start", "dwait").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.postgres
def test_two_daemons_one_event_per_missed_deadline(tmp_path, pg_url: str) -> None:
    """Two daemons on one PostgreSQL database: each missed deadline is acted on once (one
    command row, one event), moved or alerted."""
    fr = Flowrun(tmp_path)
    fr.db = pg_url
    moving = write_flow(fr.flows, "dwait", WAIT)
    alerting = write_flow(fr.flows, "dalert", ALERT.replace("1s", "2s"))
    engine = make_engine(pg_url)
    daemons = [fr.daemon(worker_id=f"dl{w}", log=f"d{w}") for w in range(2)]
    try:
        for d in daemons:
            poll(lambda d=d: "sensors ready" in d.log(), 60, what="hub ready")
        with engine.begin() as conn:
            flows = (load_flow(moving), load_flow(alerting))
            ids = [create_instance(conn, flows[i % 2]) for i in range(100)]
        count = "SELECT count(*) FROM commands WHERE command = 'deadline'"
        poll(lambda: sql(engine, count)[0][0] >= len(ids), 120, what="every deadline acted on")
        time.sleep(2.0)  # later looks act on none of them again
    finally:
        for d in daemons:
            d.stop()
    per = sql(engine, "SELECT instance_id, count(*) FROM commands GROUP BY instance_id")
    assert sorted(per) == [(i, 1) for i in sorted(ids)]
    events_stored = sql(engine, "SELECT count(*), count(DISTINCT key) FROM events")[0]
    assert events_stored == (100, 100)  # the sensor 'late' listens to every flow
    states = sql(engine, "SELECT flow, state, count(*) FROM instances GROUP BY flow, state")
    assert sorted(states) == [("dalert", "wait", 50), ("dwait", "escalate", 50)]
    assert sql(engine, "SELECT count(*) FROM instances WHERE deadline_at IS NOT NULL")[0][0] == 0


def test_console_detail_counts_down_to_the_deadline(tmp_path) -> None:
    from runner.tui.data import ConsoleData
    from runner.tui.screens.detail import summary_text

    fr = Flowrun(tmp_path)
    path = write_flow(fr.flows, "dlong", WAIT.replace("2s", "1h"))
    engine = make_engine(fr.db)
    try:
        iid = start(engine, path)
        created = sql(engine, "SELECT created_at FROM instances WHERE id = :i", i=iid)[0][0]
        data = ConsoleData(engine, clock=lambda: created, flows_dir=fr.flows)
        detail = data.detail(iid)
        assert detail is not None
        assert "deadline 1h00m → escalate" in summary_text(detail, created).plain
        assert "deadline 48m → escalate" in summary_text(detail, created + 720).plain
        assert "deadline passed 5s ago → escalate" in summary_text(detail, created + 3605).plain
        data.close()
    finally:
        engine.dispose()
