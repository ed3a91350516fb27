"""Lifecycle events (issue 30, item 1) against real daemons: each transition is stored once,
in its own transaction, with its fields; a CLI kill emits too; rules act on them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runner.flowspec.spec_sensors import EVENT_FIELDS
from tests.support.fault import Flowrun, daemon_running, engine_at, poll, sql, write_flow

pytestmark = pytest.mark.timeout(240)

BAD = """\
initial: work
defaults:
  error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}
states:
  work:
    exec: [sh, -c, "echo first >&2; echo 'disk full' >&2; exit 1"]
    next: done
  done: {terminal: true}
"""

WAIT = """\
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""

WATCH = """\
initial: note
states:
  note: {external: true, on: {go: done}}
  done: {terminal: true}
sensors:
  trouble:
    lifecycle: {flows: [bad, waiter], on: [failed, killed, completed]}
rules:
  - when: trouble
    start: watch
    data: {instance: "{event.instance}", kind: "{event.kind}", why: "{event.explain}"}
"""


def _start(fr: Flowrun, flow: str) -> int:
    res = fr("start", flow)
    assert res.returncode == 0, res.stderr
    return int(re.findall(r"\d+", res.stdout)[-1])


def _events(engine) -> list[tuple[str, str, dict, str | None]]:
    rows = sql(engine, "SELECT sensor, key, payload, action FROM events ORDER BY id")
    return [(s, k, p if isinstance(p, dict) else json.loads(p), a) for s, k, p, a in rows]


def test_failures_kills_and_completions_are_events(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "bad", BAD)
    write_flow(fr.flows, "waiter", WAIT)
    write_flow(fr.flows, "watch", WATCH)
    engine = engine_at(tmp_path)
    with daemon_running(fr, "life"):
        bad = [_start(fr, "bad") for _ in range(3)]
        killed, sent = _start(fr, "waiter"), _start(fr, "waiter")
        poll(
            lambda: sql(engine, "SELECT count(*) FROM instances WHERE status='failed'")[0][0] == 3,
            what="3 failed",
        )
        res = fr("kill", str(killed))
        assert res.returncode == 0, res.stderr
        res = fr("send", str(sent), "go")
        assert res.returncode == 0, res.stderr
        poll(
            lambda: sql(engine, "SELECT count(*) FROM instances WHERE flow='watch'")[0][0] == 5,
            what="a watch instance per event",
        )
    events = _events(engine)
    assert {s for s, *_ in events} == {"watch.trouble"}
    kinds = sorted((p["instance"], p["kind"]) for _, _, p, _ in events)
    assert kinds == sorted(
        [*((b, "budget_spent") for b in bad), (killed, "killed"), (sent, "completed")]
    )
    assert len({k for _, k, _, _ in events}) == 5
    first = next(p for _, _, p, _ in events if p["instance"] == bad[0])
    assert first["flow"] == "bad" and first["state"] == "work" and first["status"] == "failed"
    assert first["error"] == "disk full" or first["error"].endswith("disk full"), first["error"]
    assert first["attempts"] == 1 and first["errors"] == 1 and first["worker"]
    assert first["at"].endswith("Z")
    assert set(first) == set(EVENT_FIELDS["lifecycle"])
    assert f"instance {bad[0]}" in first["explain"] and "failed" in first["explain"]
    assert all(a and a.startswith("started watch instance") for *_, a in events)
    # the watch instances got the event's fields through the rule's templates
    data = [
        json.loads(d) if isinstance(d, str) else d
        for (d,) in sql(engine, "SELECT data FROM instances WHERE flow='watch' ORDER BY id")
    ]
    assert sorted(d["kind"] for d in data) == sorted(k for _, k in kinds)
