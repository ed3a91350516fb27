"""Worker liveness: ``runner.ops.liveness.judge`` and ``liveness.list_workers`` (on PostgreSQL).

A worker is declared dead only when its heartbeat is stale (older than 3 heartbeat
intervals) AND it holds no lease that is still valid; a stale worker that still holds a
valid instance or sensor lease is ``late``, not dead.
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from runner.ops.liveness import HEARTBEAT, STALE_BEATS, judge, list_workers
from runner.store.db import make_engine
from runner.store.tables import instances, sensors, workers

NOW = 1_000_000.0
STALE = NOW - STALE_BEATS * HEARTBEAT - 0.5


@pytest.mark.parametrize(
    "beat,stopped,leases,until,verdict,alive",
    [
        (NOW - 1, None, 0, None, "alive", True),
        (NOW - STALE_BEATS * HEARTBEAT, None, 0, None, "alive", True),  # exactly 3 beats
        (STALE, None, 0, None, "dead", False),
        (STALE, None, 2, NOW - 1, "dead", False),  # its leases expired too
        (STALE, None, 2, NOW + 5, "late", True),  # stale, but a lease still valid
        (NOW - 1, NOW - 0.5, 0, None, "stopped", False),
        (STALE, NOW - 100, 1, NOW + 5, "stopped", False),
    ],
)
def test_judge(beat, stopped, leases, until, verdict, alive):
    got = judge(beat, stopped, NOW, leases=leases, lease_until=until)
    assert (got.verdict, got.alive) == (verdict, alive)
    assert got.heartbeat_age == pytest.approx(NOW - beat)
    if verdict == "late":
        assert (got.leases, got.lease_until) == (leases, until)


def _worker(wid: str, beat: float, stopped: float | None = None) -> dict:
    return {
        "id": wid,
        "host": "h",
        "pid": 1,
        "started_at": NOW - 100,
        "heartbeat_at": beat,
        "running": 0,
        "stopped_at": stopped,
    }


def _instance(locked_by: str, until: float) -> dict:
    return {
        "flow": "f",
        "version": "v",
        "state": "a",
        "status": "runnable",
        "data": {},
        "due_at": NOW,
        "locked_by": locked_by,
        "locked_until": until,
        "fence": 1,
        "attempts": 1,
        "errors": 0,
        "restarts": 0,
        "state_errors": [],
        "state_restarts": 0,
        "running_attempt": 1,
        "state_changed": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }


@pytest.mark.postgres
def test_list_workers_verdicts(pg_url):
    engine = make_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(workers),
                [
                    _worker("fresh", NOW - 1),
                    _worker("late-instance", STALE),
                    _worker("late-sensor", STALE),
                    _worker("dead", STALE),
                    _worker("expired", STALE),
                    _worker("stopped", NOW - 50, stopped=NOW - 50),
                ],
            )
            conn.execute(
                insert(instances),
                [
                    _instance("late-instance", NOW + 4),
                    _instance("late-instance", NOW + 9),
                    _instance("expired", NOW - 1),
                ],
            )
            conn.execute(
                insert(sensors),
                [
                    {
                        "name": "f.s",
                        "cursor": {},
                        "locked_by": "late-sensor",
                        "locked_until": NOW + 3,
                        "updated_at": NOW,
                    }
                ],
            )
        rows = {r["id"]: r for r in list_workers(engine, now=NOW)}
    finally:
        engine.dispose()
    verdicts = {k: (r["verdict"], r["alive"]) for k, r in rows.items()}
    assert verdicts == {
        "fresh": ("alive", True),
        "late-instance": ("late", True),
        "late-sensor": ("late", True),
        "dead": ("dead", False),
        "expired": ("dead", False),
        "stopped": ("stopped", False),
    }
    assert rows["late-instance"]["leases"] == 2
    assert rows["late-instance"]["lease_until"].endswith("Z")
    assert rows["dead"]["leases"] == 0 and rows["dead"]["lease_until"] is None
    assert rows["fresh"]["heartbeat_at"].endswith("Z")
