"""The deliveries a daemon's rules queue are queued already claimed by its deliverer
(``RuleEngine(deliver_as=...)``): handed over, never claimed again by ``claim_due`` while
the lease holds, given back untried (due at once for any daemon) when the daemon stops."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event

from runner.sensors.deliver import LEASE, Deliverer
from runner.sensors.events import store_event
from runner.sensors.rules import RuleEngine
from runner.store.db import make_engine
from runner.store.deliveries import claim_due
from tests.support.fault import sql
from tests.support.sensor_hub import registry, write_flow

FLOW = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt"}}
rules:
  - {when: inbox, webhook: {url: "http://127.0.0.1:9/{event.path}"}}
  - {when: inbox, pause: {}}
"""


def test_queued_deliveries_are_handed_to_the_daemon_that_queued_them(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    try:
        write_flow(tmp_path / "flows", "f", FLOW)
        ids = [store_event(engine, "f.inbox", f"{n}.txt", {"path": f"{n}.txt"}) for n in range(3)]
        rules = RuleEngine(engine, registry(tmp_path / "flows"), deliver_as=("w1", LEASE))
        assert rules.handle_pending()[0] == 3
        handed = rules.handed
        assert [c.event_id for c in handed] == ids
        assert [c.target["webhook"]["url"] for c in handed] == [
            f"http://127.0.0.1:9/{n}.txt" for n in range(3)
        ]
        assert {c.payload["path"] for c in handed} == {"0.txt", "1.txt", "2.txt"}
        rows = sql(engine, "SELECT id, locked_by, locked_until FROM deliveries ORDER BY id")
        assert [r[0] for r in rows] == [c.id for c in handed]
        assert all(r[1] == "w1" and r[2] is not None for r in rows)
        actions = [r[0] for r in sql(engine, "SELECT action FROM events ORDER BY id")]
        assert all(a.startswith("webhook queued (delivery ") for a in actions)
        assert all("; pause: 0 of 0 f instances" in a for a in actions)  # in its savepoint
        assert claim_due(engine, "w2", 60.0) == []  # held by w1 while its lease lasts
        assert claim_due(engine, "w1", 60.0) == []  # w1's own, in flight: not again

        deliverer = Deliverer(engine, None, "w1")
        deliverer.hand(handed)
        deliverer.give_back()  # the daemon stopped before sending them
        assert sorted(c.id for c in claim_due(engine, "w2", 60.0)) == [c.id for c in handed]
    finally:
        engine.dispose()


ONCE = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.txt"}}
rules:
  - when: inbox
    webhook: {url: "http://127.0.0.1:9/hook"}
    once_per: {key: "{event.path}", window: 1h}
"""


def test_a_batch_under_once_per_folds_with_a_few_statements(tmp_path: Path) -> None:
    """60 events of two keys in one batch: one delivery a key, handed over with what
    folded into it counted, each event's action saying which; the transaction writes
    the batch, not statements an event (it was a savepoint, a read and a write each)."""
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    try:
        write_flow(tmp_path / "flows", "f", ONCE)
        ids = [
            store_event(engine, "f.inbox", f"e{n}", {"path": "ab"[n % 2] + ".txt"})
            for n in range(60)
        ]
        rules = RuleEngine(engine, registry(tmp_path / "flows"), deliver_as=("w1", LEASE))
        statements: list[str] = []
        listen = lambda *a: statements.append(a[2])  # noqa: E731 - before_cursor_execute
        event.listen(engine, "before_cursor_execute", listen)
        try:
            assert rules.handle_pending() == (60, 2)  # two actions: one delivery a key
        finally:
            event.remove(engine, "before_cursor_execute", listen)
        a, b = rules.handed
        assert (a.event_id, b.event_id) == (ids[0], ids[1])
        rows = sql(engine, "SELECT id, once_key, suppressed, locked_by FROM deliveries ORDER BY id")
        assert rows == [(a.id, "a.txt", 29, "w1"), (b.id, "b.txt", 29, "w1")]
        actions = [r[0] for r in sql(engine, "SELECT action FROM events ORDER BY id")]
        assert actions[:2] == [
            f"webhook queued (delivery {a.id})",
            f"webhook queued (delivery {b.id})",
        ]
        assert actions[2:] == [
            f"webhook folded into delivery {(a, b)[n % 2].id} (once_per)" for n in range(2, 60)
        ]
        assert len(statements) < 20, statements
    finally:
        engine.dispose()
