"""A failed delivery's retry is due by the database's clock (``runner.store.clock``), as
its ``give_up_at`` and its lease are: a host whose clock is off neither gives up early
nor retries at once.

The engine is SQLite (one host, the local clock) given a clock of its own, as
``runner.store.pg_engine.pg_engine`` gives every PostgreSQL engine, with a known offset: the
host's clock 90 s ahead of the database's, or 90 s behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.sensors.deliver import BACKOFF_FIRST, Deliverer, Outcome
from runner.sensors.events import store_event
from runner.store.clock import track_server_clock
from runner.store.db import make_engine
from runner.store.deliveries import claim_due, finish, queue_many


@pytest.mark.parametrize("host_ahead", [90.0, -90.0])
def test_a_retry_is_due_by_the_database_clock(tmp_path: Path, host_ahead: float) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'flowrun.db'}")
    clock = track_server_clock(engine, "the test's database")
    clock.offset, clock.error = -host_ahead, 0.0
    try:
        event_id = store_event(engine, "f.s", "k", {})
        with engine.begin() as conn:
            (did,) = queue_many(
                conn,
                [{"event_id": event_id, "rule": "rule:f#1", "target": {}, "retry_for": 60.0}],
            )
        (claimed,) = claim_due(engine, "w", 60.0)
        tried = Deliverer(engine, None, "w")._try(claimed, Outcome("exit 1", False))
        assert tried.retry_at == pytest.approx(clock.now() + BACKOFF_FIRST, abs=1.0)
        # within retry_for by the database's clock: tried again, not failed for good
        assert finish(engine, "w", [tried]) == ["pending"]
    finally:
        engine.dispose()
