"""runner.tui.data: pages agree whatever path reads them (OFFSET, keyset, dense jump,
rowid scan), counts, throughput, and the read engine never writes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import insert, text
from sqlalchemy.exc import OperationalError

from runner.lifecycle import STATUSES
from runner.store.db import make_engine
from runner.store.tables import instances
from runner.tui import fmt
from runner.tui.data import ConsoleData
from runner.tui.model import Query
from tests.support.console_db import NOW, build_db


@pytest.fixture
def big(tmp_path: Path):
    """3,000 instances with a gap in the ids, mixed flows and statuses."""
    engine = make_engine("sqlite:///" + str(tmp_path / "big.db"))
    rnd = random.Random(1)
    rows = []
    for i in range(1, 3001):
        if 1000 <= i < 1010:
            continue  # a gap: the dense jump must notice
        rows.append(
            {"id": i, "flow": rnd.choice(["a", "b", "c"]), "version": "v", "state": "s",
             "status": rnd.choice(STATUSES), "data": {"i": i}, "due_at": NOW + rnd.random(),
             "state_errors": [], "last_error": "boom" if i % 97 == 0 else None}
        )  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(instances), rows)
    data = ConsoleData(engine, clock=lambda: NOW)
    yield data, rows
    data.close()
    engine.dispose()


def ids(page) -> list[int]:
    return [r.id for r in page.rows]


def expected(rows, q: Query) -> list[int]:
    sel = [r for r in rows if (not q.status or r["status"] == q.status)]
    sel = [r for r in sel if (not q.flow or r["flow"] == q.flow)]
    return sorted((r["id"] for r in sel), reverse=q.desc)


@pytest.mark.parametrize(
    "q",
    [Query(), Query(desc=True), Query(status="paused"), Query(flow="b", desc=True),
     Query(status="runnable", flow="a")],
)  # fmt: skip
def test_pages_agree_across_paths(big, q):
    data, rows = big
    want = expected(rows, q)
    total = data.counts(q).total
    assert total == len(want)
    for offset in (0, 37, len(want) // 2, max(0, len(want) - 5)):
        plain = data.page(q, offset, 25)
        hinted = data.page(q, offset, 25, total=total)  # dense jump / rowid scan
        assert ids(plain) == ids(hinted) == want[offset : offset + 25]
        anchor = data.page(q, max(0, offset - 30), 25, total=total)
        keyset = data.page(q, offset, 25, total=total, anchor=anchor)
        assert ids(keyset) == want[offset : offset + 25]


def test_dense_jump_is_exact_without_gaps(tmp_path):
    engine = make_engine("sqlite:///" + str(tmp_path / "d.db"))
    with engine.begin() as conn:
        conn.execute(
            insert(instances),
            [{"id": i, "flow": "f", "version": "v", "state": "s", "data": {},
              "state_errors": []} for i in range(5, 505)],
        )  # fmt: skip
    data = ConsoleData(engine, clock=lambda: NOW)
    assert ids(data.page(Query(), 100, 3, total=500)) == [105, 106, 107]
    assert ids(data.page(Query(desc=True), 100, 3, total=500)) == [404, 403, 402]
    data.close()


def test_text_filter_and_sorts(big):
    data, rows = big
    page = data.page(Query(text="boom"), 0, 100)
    assert ids(page) == [r["id"] for r in rows if r["last_error"]]
    assert data.counts(Query(text="boom")).total == len(page.rows)
    for sort in ("flow", "status", "due", "attempts", "state", "restarts", "errors"):
        p = data.page(Query(sort=sort), 0, 50)
        assert len(p.rows) == 50


def test_counts_and_throughput(tmp_path):
    engine, _db, _flows = build_db(tmp_path)
    data = ConsoleData(engine, clock=lambda: NOW)
    counts = data.counts(Query())
    assert counts.by_status == {"runnable": 3, "sleeping": 2, "paused": 2, "completed": 2,
                                "failed": 2, "killed": 1}  # fmt: skip
    assert data.counts(Query(flow="reports")).total == 4
    spark = data.throughput(NOW, 60)
    assert len(spark) == 60 and sum(spark) == 30 and spark[:29] == [0] * 29
    page = data.page(Query(), 0, 5)
    assert page.rows[0].max_errors == 4 and page.rows[0].window == 3600
    detail = data.detail(1)
    assert detail.flow.name == "orders" and detail.policy.max_errors == 4
    assert [a["attempt"] for a in detail.attempts] == [3, 2, 1]
    assert data.detail(999) is None
    assert data.allowed_events([2]) == ["approve", "reject"]
    assert data.flow_names() == ["orders", "reports"]
    data.close()


def test_detail_shows_the_running_attempt_from_the_instance_row(tmp_path):
    """A running attempt has no row until it ends: the detail builds it from the instance
    row (its number, state, worker and start), newest first; an early row is not doubled."""
    engine, _db, _flows = build_db(tmp_path)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE instances SET running_attempt = 3, state_attempted = :t WHERE id = 1"),
            {"t": NOW - 8},
        )
    data = ConsoleData(engine, clock=lambda: NOW)
    assert [a["attempt"] for a in data.detail(1).attempts] == [3, 2, 1], "row 3 exists"
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE instances SET running_attempt = 4, state_attempted = :t WHERE id = 1"),
            {"t": NOW - 1},
        )
    attempts = data.detail(1).attempts
    assert [a["attempt"] for a in attempts] == [4, 3, 2, 1]
    running = attempts[0]
    assert (running["state"], running["worker"], running["started_at"]) == ("fetch", "w1", NOW - 1)
    assert running["outcome"] is None and running["finished_at"] is None
    data.close()


def test_read_engine_cannot_write(tmp_path):
    engine, _db, _flows = build_db(tmp_path)
    data = ConsoleData(engine, clock=lambda: NOW)
    assert data.reader is not engine
    with pytest.raises(OperationalError), data.reader.connect() as conn:
        conn.execute(text("DELETE FROM instances"))
    assert data.counts(Query()).total == 12
    data.close()


def test_fmt_helpers():
    assert fmt.span(0.25) == "250ms" and fmt.span(42) == "42s" and fmt.span(3600 * 3) == "3h00m"
    assert fmt.due_in(NOW - 1, NOW, "runnable") == "now"
    assert fmt.due_in(None, NOW, "runnable") == "event"
    assert fmt.due_in(NOW + 5, NOW, "completed") == ""
    assert (
        fmt.lock("w1", NOW + 9.5, NOW) == "w1 9s" and fmt.lock("w1", NOW - 1, NOW) == "w1 expired"
    )
    assert fmt.budget_used([NOW - 10, NOW - 7200], NOW, 3600) == 1
    assert fmt.budget(1, 8) == "1/8" and fmt.budget(2, None) == "2"
    assert fmt.sparkline([0, 1, 2, 4]) == "▁▃▅█"
    assert fmt.bar(2, 4, 4) == "██░░"
