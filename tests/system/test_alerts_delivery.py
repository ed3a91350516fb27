"""Alerts out (issue 30, item 2) from a real daemon to a real HTTP receiver in the test
process and to a real exec notifier: one delivery per transition, secrets from the
environment never stored, retries until the receiver is back, once_per folding."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from tests.support.fault import (
    Flowrun,
    daemon_running,
    engine_at,
    load,
    new_instance,
    poll,
    sql,
    write_flow,
)
from tests.support.receiver import Receiver, receiving

pytestmark = pytest.mark.timeout(300)

BAD = """\
initial: work
defaults:
  error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}
states:
  work:
    exec: [sh, -c, "echo 'disk full' >&2; exit 1"]
    next: done
  done: {terminal: true}
sensors:
  trouble: {lifecycle: {flows: [bad]}}
rules:
"""

SECRET = "s3cret-token-never-stored"


def _start(fr: Flowrun, flow: str, n: int) -> None:
    """``n`` instances of ``flow``, created directly (a `flowrun start` costs ~1 s here)."""
    engine, compiled = engine_at(fr.home), load(fr.flows / f"{flow}.yaml")
    for _ in range(n):
        new_instance(engine, compiled, {})


def _deliveries(engine) -> list[dict]:
    cols = "id, event_id, status, attempts, last_result, delivered_at, suppressed, target"
    rows = sql(engine, f"SELECT {cols} FROM deliveries ORDER BY id")
    return [dict(zip([c.strip() for c in cols.split(",")], r, strict=True)) for r in rows]


def test_webhook_once_per_failure_with_secret_header(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    with receiving() as rec:
        rule = (
            "  - when: trouble\n"
            f"    webhook: {{url: '{rec.url}/hook/{{event.flow}}', "
            "headers: {Authorization: 'Bearer {env.HOOK_TOKEN}'}}\n"
        )
        write_flow(fr.flows, "bad", BAD + rule)
        fr.env["HOOK_TOKEN"] = SECRET
        engine = engine_at(tmp_path)
        with daemon_running(fr, "hook"):
            _start(fr, "bad", 5)
            poll(lambda: len(rec.got()) >= 5, what="5 webhooks")
            poll(lambda: all(d["status"] == "delivered" for d in _deliveries(engine)))
        got = rec.got()
    assert len(got) == 5
    bodies = [r.json() for r in got]
    assert sorted(b["instance"] for b in bodies) == [1, 2, 3, 4, 5]
    assert {b["kind"] for b in bodies} == {"budget_spent"}
    assert bodies[0]["error"] == "exit code 1: disk full"
    assert all(r.path == "/hook/bad" and r.method == "POST" for r in got)
    assert all(r.headers["Authorization"] == f"Bearer {SECRET}" for r in got)
    assert sorted(int(r.headers["Idempotency-Key"]) for r in got) == sorted(
        b["event_id"] for b in bodies
    )
    delivered = _deliveries(engine)
    assert [d["attempts"] for d in delivered] == [1] * 5
    assert all(d["last_result"] == "HTTP 200" and d["delivered_at"] for d in delivered)
    assert SECRET.encode() not in (tmp_path / "flowrun.db").read_bytes()


def test_receiver_down_then_back_every_alert_once(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    with socket.socket() as s:  # a port nobody listens on, for now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rule = f"  - when: trouble\n    webhook: {{url: 'http://127.0.0.1:{port}/x'}}\n"
    write_flow(fr.flows, "bad", BAD + rule)
    engine = engine_at(tmp_path)
    with daemon_running(fr, "down"):
        _start(fr, "bad", 3)
        poll(
            lambda: sum(d["attempts"] >= 2 for d in _deliveries(engine)) == 3,
            what="each delivery tried twice while the receiver is down",
        )
        assert all("cannot reach" in d["last_result"] for d in _deliveries(engine))
        rec = Receiver()
        rec.answer = lambda r: (503, {}) if rec.tries < 2 else (200, {})  # then 2 x 503
        with receiving(port, rec):
            poll(lambda: len(rec.got()) == 3, what="3 delivered once back")
            poll(lambda: all(d["status"] == "delivered" for d in _deliveries(engine)))
    assert sorted(r.json()["instance"] for r in rec.got()) == [1, 2, 3]
    assert rec.tries == 5  # 2 answered 503, then each delivered exactly once


def test_once_per_folds_and_exec_notifier(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    notify = (
        "import json, os, sys\n"
        "doc = json.load(sys.stdin)\n"
        "with open('alerts.log', 'a') as f:\n"
        "    f.write(json.dumps([os.environ['FLOWRUN_EVENT_ID'], doc]) + '\\n')\n"
    )
    rule = (
        "  - when: trouble\n"
        "    exec: [python, notify.py, '{event.flow}']\n"
        "    once_per: {window: 1h}\n"
    )
    write_flow(fr.flows, "bad", BAD + rule, {"notify": notify})
    engine = engine_at(tmp_path)
    n = 100
    with daemon_running(fr, "once"):
        _start(fr, "bad", n)
        poll(
            lambda: (
                sql(engine, "SELECT count(*) FROM events WHERE handled_at IS NOT NULL")[0][0] == n
            ),
            what=f"{n} events handled",
        )
        poll(lambda: (fr.flows / "alerts.log").exists(), what="the notifier ran")
        poll(lambda: _deliveries(engine)[0]["status"] == "delivered")
    [only] = _deliveries(engine)
    assert only["suppressed"] == n - 1
    lines = (fr.flows / "alerts.log").read_text().splitlines()
    assert len(lines) == 1
    event_id, doc = json.loads(lines[0])
    assert int(event_id) == doc["event_id"] == only["event_id"] and doc["suppressed"] == 0
    actions = [a for (a,) in sql(engine, "SELECT action FROM events ORDER BY id")]
    assert actions[0] == f"exec queued (delivery {only['id']})"
    assert actions[1:] == [f"exec folded into delivery {only['id']} (once_per)"] * (n - 1)
    assert os.environ.get("FLOWRUN_EVENT_ID") is None
    # flowrun events: the lifecycle event, its delivery and the folded count
    shown = json.loads(fr("events", "--json", "--limit", "200").stdout)
    first = next(e for e in shown if e["id"] == only["event_id"])
    assert (
        first["what"]
        == f"instance {doc['instance']} (bad, work) budget_spent: exit code 1: disk full"
    )
    [d] = first["deliveries"]
    assert (d["status"], d["attempts"], d["suppressed"]) == ("delivered", 1, n - 1)
    text = fr("events", "--limit", "200").stdout
    assert f"delivery {only['id']} exec python notify.py bad: delivered at" in text
    assert f"after 1 try (exit 0), {n - 1} suppressed (once_per)" in text


def test_on_failure_sugar_posts_each_failure(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    with receiving() as rec:
        flow = BAD.split("sensors:")[0] + f"on_failure: {{webhook: {{url: '{rec.url}/f'}}}}\n"
        write_flow(fr.flows, "bad", flow)
        with daemon_running(fr, "sugar"):
            _start(fr, "bad", 2)
            poll(lambda: len(rec.got()) == 2, what="2 failures posted")
        got = [r.json() for r in rec.got()]
    assert sorted(g["instance"] for g in got) == [1, 2]
    assert {(g["sensor"], g["kind"], g["status"]) for g in got} == {
        ("bad.on_failure", "budget_spent", "failed")
    }


def test_delivery_of_a_killed_daemon_is_finished_by_another(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    release, arrived = threading.Event(), threading.Event()
    rec = Receiver()

    def answer(request) -> tuple[int, dict]:
        arrived.set()
        return (200, {}) if release.wait(120) else (500, {})

    rec.answer = answer
    with receiving(receiver=rec):
        rule = f"  - when: trouble\n    webhook: {{url: '{rec.url}/x', timeout: 2m}}\n"
        write_flow(fr.flows, "bad", BAD + rule)
        engine = engine_at(tmp_path)
        daemons = {w: fr.daemon(worker_id=w, log=w) for w in ("da", "db")}
        try:
            for d in daemons.values():
                poll(lambda d=d: "sensors ready" in d.log(), 60, what="hub ready")
            _start(fr, "bad", 1)
            holder = poll(
                lambda: arrived.is_set() and sql(engine, "SELECT locked_by FROM deliveries")[0][0],
                what="a daemon sending (the receiver holds the request)",
            )
            daemons[holder].proc.kill()  # SIGKILL mid-delivery
            daemons[holder].wait(30)
            release.set()
            poll(
                lambda: sql(engine, "SELECT status FROM deliveries")[0][0] == "delivered",
                90,
                what="the other daemon delivered it",
            )
            [(by, attempts)] = sql(engine, "SELECT last_result, attempts FROM deliveries")
        finally:
            release.set()
            for d in daemons.values():
                d.stop()
    assert by == "HTTP 200" and attempts == 1  # the killed daemon's try was never recorded
    keys = {r.headers["Idempotency-Key"] for r in rec.got()}
    assert len(keys) == 1 and len(rec.got()) >= 1  # at least once, one event id
