"""Each worker is judged by its own heartbeat interval (``workers.heartbeat_every``), which
grows with its lease; rows from before that column (``NULL``) by the old fixed 2 s."""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from runner.engine.worker import Worker, WorkerConfig
from runner.ops.liveness import HEARTBEAT, STALE_BEATS, judge, read_workers
from runner.store import heartbeat
from runner.store.db import make_engine
from runner.store.reader import open_sqlite
from runner.store.revision import latest_revision
from runner.store.tables import workers

NOW = 1_000_000.0


@pytest.mark.parametrize(
    "lease,every",
    [(60.0, 20.0), (30.0, 10.0), (2.0, 2 / 3), (600.0, heartbeat.HEARTBEAT_MAX)],
)
def test_heartbeat_is_a_third_of_the_lease_at_most_a_minute(lease, every):
    assert heartbeat.heartbeat_interval(lease) == pytest.approx(every)
    assert Worker(make_engine("sqlite://"), WorkerConfig(lease=lease)).heartbeat == every


def test_an_explicit_heartbeat_wins():
    engine = make_engine("sqlite://")
    assert Worker(engine, WorkerConfig(lease=60, heartbeat=1.5)).heartbeat == 1.5


@pytest.mark.parametrize(
    "age,every,verdict",
    [
        (25.0, 20.0, "alive"),  # stale by the old 2 s, fresh by its own 20 s
        (STALE_BEATS * 20.0, 20.0, "alive"),  # exactly three of its beats
        (STALE_BEATS * 20.0 + 0.5, 20.0, "dead"),
        (5.0, 1.0, "dead"),  # a fast beater is stale sooner than the old 6 s
        (STALE_BEATS * HEARTBEAT, None, "alive"),  # an old row: the old 2 s
        (STALE_BEATS * HEARTBEAT + 0.5, None, "dead"),
    ],
)
def test_judge_uses_the_workers_own_interval(age, every, verdict):
    assert judge(NOW - age, None, NOW, heartbeat=every).verdict == verdict


def test_read_workers_judges_each_row_by_its_own_interval(tmp_path):
    """Through SQLAlchemy and through the CLI's stdlib ``sqlite3`` reader alike."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    engine = make_engine(url)
    base = {"host": "h", "pid": 1, "started_at": NOW - 100, "running": 0}
    rows = [
        {"id": "slow", "heartbeat_at": NOW - 30, "heartbeat_every": 20.0},
        {"id": "fast", "heartbeat_at": NOW - 30, "heartbeat_every": 2.0},
        {"id": "old", "heartbeat_at": NOW - 5, "heartbeat_every": None},
        {"id": "old-stale", "heartbeat_at": NOW - 7, "heartbeat_every": None},
    ]
    with engine.begin() as conn:
        conn.execute(insert(workers), [{**base, **r} for r in rows])
    want = {"slow": "alive", "fast": "dead", "old": "alive", "old-stale": "dead"}
    assert {r["id"]: r["verdict"] for r in read_workers(engine, now=NOW)} == want
    engine.dispose()
    reader = open_sqlite(url, latest_revision())
    assert reader is not None
    rows = read_workers(reader, now=NOW)
    assert {r["id"]: r["verdict"] for r in rows} == want
    assert {r["id"]: r["heartbeat_every"] for r in rows}["slow"] == 20.0
    reader.close()


def test_register_records_the_interval(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    heartbeat.register(engine, "w1", 10.0)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT heartbeat_every FROM workers").scalar_one() == 10.0
    engine.dispose()
