"""runner.tui.spark: the sparkline read a little at a time agrees, look after look, with
counting every attempt row of the window, on SQLite and PostgreSQL; a look on a busy
minute reads only the rows written since the earlier looks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select

from runner.store.db import make_engine
from runner.store.tables import attempts, instances
from runner.tui.spark import Sparkline

T0 = 1_700_000_000.0


def _brute(engine: Engine, now: float, seconds: int = 60) -> list[int]:
    end = int(now)
    out = [0] * seconds
    with engine.connect() as conn:
        for (fin,) in conn.execute(select(attempts.c.finished_at)):
            if fin is not None and end - seconds <= fin < end:
                out[int(fin) - (end - seconds)] += 1
    return out


def _engine(request, tmp_path: Path) -> Engine:
    if request.param == "sqlite":
        return make_engine("sqlite:///" + str(tmp_path / "spark.db"))
    return make_engine(request.getfixturevalue("pg_url"))


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path):
    eng = _engine(request, tmp_path)
    with eng.begin() as conn:
        conn.execute(
            insert(instances),
            [
                {
                    "id": 1,
                    "flow": "f",
                    "version": "v",
                    "state": "s",
                    "status": "runnable",
                    "data": {},
                    "state_errors": [],
                    "created_at": T0,
                    "updated_at": T0,
                }
            ],  # fmt: skip
        )
    yield eng
    eng.dispose()


def _write(engine: Engine, fins: list[float], attempt: list[int]) -> None:
    rows = []
    for fin in fins:
        attempt[0] += 1
        rows.append(
            {
                "instance_id": 1,
                "attempt": attempt[0],
                "state": "s",
                "worker": "w",
                "started_at": fin - 0.1,
                "finished_at": fin,
                "outcome": "moved",
            }  # fmt: skip
        )
    if rows:
        with engine.begin() as conn:
            conn.execute(insert(attempts), rows)


def test_looks_agree_with_counting_every_row(engine):
    """Two looks a second for two minutes, rows written as they finish (some a little
    late, within the margin), a pause longer than the window and a clock set back: each
    look equals the count of every row."""
    rnd = random.Random(3)
    spark = Sparkline()
    attempt = [0]
    now = T0
    for step in range(240):
        if step == 150:
            now += 90  # the console was not looking for longer than the window
        if step == 190:
            now -= 30  # the clock was set back
        fins = [now - rnd.uniform(0, 0.9) for _ in range(rnd.randint(0, 40))]
        _write(engine, fins, attempt)
        with engine.connect() as conn:
            got = spark.look(conn, now)
        assert got == _brute(engine, now), f"step {step}"
        now += 0.5


def test_a_look_reads_only_the_rows_written_since(engine):
    """After a first look over a busy minute (6,000 rows), the next looks read only the
    rows above an id some earlier look saw, not the minute again, and still agree."""
    attempt = [0]
    _write(engine, [T0 - 60 + i * 0.01 for i in range(6000)], attempt)
    spark = Sparkline()
    floors: list[int] = []
    now = T0
    for _ in range(8):
        with engine.connect() as conn:
            got = spark.look(conn, now)
        floors.append(spark.floor)
        assert got == _brute(engine, now)
        _write(engine, [now + 0.1 * k for k in range(5)], attempt)
        now += 0.5
    assert floors[0] < 0  # the first look: the newest LOOKBACK rows
    assert all(f >= 6000 for f in floors[5:]), floors  # later ones: only new rows
