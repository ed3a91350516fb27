"""``once_per`` folding (``runner.store.once_per``), on SQLite and PostgreSQL: one
delivery per rule and key per window, the rest counted on it; a batch of events folds
with a read per key and one ``INSERT``, not statements per event; a new delivery after
the window carries what its key folded before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, event

from runner.store.once_per import queue, queue_folding
from tests.support.fault import either_world, sql

FLOW = """\
initial: a
states:
  a: {exec: [python, -c, "pass"], next: done}
  done: {terminal: true}
"""
HOUR = 3600.0
AT = 2_000_000_000.0
TARGET = {"webhook": {"url": "http://127.0.0.1:9/hook", "method": "POST"}}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request, tmp_path: Path) -> Iterator[Engine]:
    eng, _ = either_world(request, tmp_path, "once", FLOW)
    try:
        yield eng
    finally:
        eng.dispose()


def _row(event_id: int, key: str, rule: str = "rule:once#1") -> dict:
    return {
        "event_id": event_id,
        "rule": rule,
        "target": TARGET,
        "retry_for": HOUR,
        "once_key": key,
        "window": HOUR,
    }


@contextmanager
def _statements(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` runs inside the block."""
    seen: list[str] = []

    def note(conn, cursor, statement, params, context, executemany) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _deliveries(engine: Engine) -> list[tuple]:
    return sql(
        engine,
        "SELECT id, event_id, once_key, suppressed, folded_before, locked_by "
        "FROM deliveries ORDER BY id",
    )


def test_a_batch_queues_one_a_key_and_counts_the_rest_on_it(engine: Engine) -> None:
    rows = [_row(1, "a"), _row(2, "b"), _row(3, "a"), _row(4, "a"), _row(5, "b")]
    with engine.begin() as conn:
        got = queue_folding(conn, rows, at=AT, held_by="w1", lease=30.0)
    (a_id, _, a_key, a_sup, a_before, a_by), (b_id, _, b_key, b_sup, _, _) = _deliveries(engine)
    assert (a_key, a_sup, a_before, a_by) == ("a", 2, 0, "w1")
    assert (b_key, b_sup) == ("b", 1)
    assert got == [
        (a_id, True, 0),
        (b_id, True, 0),
        (a_id, False, 0),
        (a_id, False, 0),
        (b_id, False, 0),
    ]


def test_a_later_batch_folds_into_the_delivery_still_in_its_window(engine: Engine) -> None:
    with engine.begin() as conn:
        [(first, made, _)] = queue_folding(conn, [_row(1, "a")], at=AT)
    with engine.begin() as conn:
        got = queue_folding(conn, [_row(2, "a"), _row(3, "a")], at=AT + HOUR - 1)
    assert made and got == [(first, False, 0), (first, False, 0)]
    assert [(d[0], d[3]) for d in _deliveries(engine)] == [(first, 2)]
    # the window over: a new delivery says how many its key folded since the last one
    with engine.begin() as conn:
        [(second, made, before)] = queue_folding(conn, [_row(4, "a")], at=AT + HOUR + 1)
    assert made and second != first and before == 2
    assert [(d[0], d[3], d[4]) for d in _deliveries(engine)] == [(first, 2, 0), (second, 0, 2)]


def test_keys_of_different_rules_are_apart(engine: Engine) -> None:
    rows = [_row(1, "a", "rule:once#1"), _row(1, "a", "rule:once#2"), _row(2, "a", "rule:once#2")]
    with engine.begin() as conn:
        got = queue_folding(conn, rows, at=AT)
    one, two = (d[0] for d in _deliveries(engine))
    assert got == [(one, True, 0), (two, True, 0), (two, False, 0)]


def test_a_hundred_events_of_one_key_are_a_few_statements(engine: Engine) -> None:
    with _statements(engine) as statements, engine.begin() as conn:
        got = queue_folding(conn, [_row(n, "a") for n in range(1, 101)], at=AT)
    assert sum(made for _, made, _ in got) == 1
    assert [d[3] for d in _deliveries(engine)] == [99]
    writes = [s for s in statements if s.lstrip().upper().startswith(("INSERT", "UPDATE"))]
    assert len(writes) == 1, writes  # the one INSERT; nothing a folded event
    assert len(statements) <= 4, statements  # (PostgreSQL's advisory lock,) a read, the write


def test_one_event_at_a_time_folds_the_same(engine: Engine) -> None:
    """``queue`` (``events replay``) keeps the same rule as the batch."""
    with engine.begin() as conn:
        first = queue(conn, 1, "rule:once#1", TARGET, retry_for=HOUR, once_key="k", window=HOUR)
        again = queue(conn, 2, "rule:once#1", TARGET, retry_for=HOUR, once_key="k", window=HOUR)
        plain = queue(conn, 3, "rule:once#1", TARGET, retry_for=HOUR)
    assert first[1] and again == (first[0], False)
    assert plain[1] and plain[0] != first[0]
    assert [(d[0], d[2], d[3]) for d in _deliveries(engine)] == [
        (first[0], "k", 1),
        (plain[0], None, 0),
    ]


def test_plain_deliveries_are_queued_with_the_batch_in_the_same_insert(engine: Engine) -> None:
    plain = {"event_id": 9, "rule": "rule:once#2", "target": TARGET, "retry_for": HOUR}
    rows = [_row(1, "a"), plain, _row(2, "a"), {**plain, "event_id": 10}]
    with _statements(engine) as statements, engine.begin() as conn:
        got = queue_folding(conn, rows, at=AT)
    once, first, second = (d[0] for d in _deliveries(engine))
    assert got == [(once, True, 0), (first, True, 0), (once, False, 0), (second, True, 0)]
    assert sum(s.lstrip().upper().startswith("INSERT") for s in statements) == 1
