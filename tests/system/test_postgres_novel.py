"""explain, sleep/wake, rule replay and migrate on the real PostgreSQL server:
the same functions the CLI calls, on a fresh database per test (``pg_url``)."""

from __future__ import annotations

import time
from pathlib import Path

from runner.flowspec.registry import FlowRegistry
from runner.ops.commands import submit
from runner.ops.detail import instance_rows
from runner.ops.explain import explain
from runner.ops.migrate import migrate
from runner.sensors.events import record_events
from runner.sensors.replay import replay
from runner.sensors.rules import RuleEngine
from runner.store.create import create_instance, record_version
from runner.store.db import make_engine
from runner.store.versions import compiled
from tests.support.fault import row, sql

FLOW = """\
flow: pgx
initial: wait
states:
  wait: {external: true, on: {go: work}}
  work: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.csv"}}
rules:
  - when: inbox
    start: pgx
    data: {path: "{event.path}"}
"""


def test_replay_sleep_migrate_explain_on_postgres(pg_url, tmp_path: Path) -> None:
    engine = make_engine(pg_url)
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "pgx.yaml").write_text(FLOW)
    registry = FlowRegistry(flows)
    assert registry.load_all() == []
    flow = registry.get("pgx")
    with engine.begin() as conn:
        record_version(conn, flow)
    record_events(engine, "pgx.inbox", [("k1", {"path": "/in/a.csv", "name": "a.csv"})])
    RuleEngine(engine, registry).handle_pending()
    [(eid,)] = sql(engine, "SELECT id FROM events")
    [(iid,)] = sql(engine, "SELECT id FROM instances")
    [again] = replay(engine, registry, [eid])
    assert again.rules[0].taken and again.rules[0].done is None
    [forced] = replay(engine, registry, [eid], force=True)
    assert forced.rules[0].done.startswith("started pgx instance")
    assert sql(engine, "SELECT COUNT(*) FROM instances WHERE event_id = :e", e=eid) == [(2,)]
    assert "replayed at" in sql(engine, "SELECT action FROM events")[0][0]

    submit(engine, [iid], "send", event="go")
    [slept] = submit(engine, [iid], "sleep", until=time.time() + 3600)
    assert slept.ok and row(engine, iid)["status"] == "sleeping"
    [woke] = submit(engine, [iid], "wake")
    assert woke.ok and row(engine, iid)["status"] == "runnable"

    (flows / "pgx.yaml").write_text(
        FLOW.replace("wait:", "hold:").replace("initial: wait", "initial: hold")
    )
    registry = FlowRegistry(flows)
    assert registry.load_all() == []
    new = registry.get("pgx")
    with engine.begin() as conn:
        record_version(conn, new)
        other = create_instance(conn, flow, {})
    results = {m.instance_id: m for m in migrate(engine, "pgx", new.version)}
    assert results[iid].ok and not results[other].ok  # `wait` is gone from the new version
    assert "--map wait=NEW" in results[other].message
    results = {
        m.instance_id: m for m in migrate(engine, "pgx", new.version, mapping={"wait": "hold"})
    }
    assert results[other].ok and row(engine, other)["state"] == "hold"

    result = explain(instance_rows(engine, iid), lambda v: compiled(engine, v), time.time())
    kinds = [e.kind for e in result.timeline]
    assert kinds[0] == "created" and "version" in kinds and "sleep" in kinds
    assert result.timeline[0].data["event_id"] == eid
    engine.dispose()
