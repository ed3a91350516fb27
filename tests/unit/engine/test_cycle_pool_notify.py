"""Who a busy pool's release tells, on the real PostgreSQL server: a cycle whose commit
frees a seat wakes a waiter in the same transaction and, when its own claim takes that
waiter, sends no ``NOTIFY`` (every other daemon would claim for nothing); when it leaves
the waiter to others (no free slot of its own), it tells them.

A second connection ``LISTEN``s on the due channel, as a daemon's listener does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from runner.flowspec.compiled import CompiledFlow
from runner.store.db import make_engine
from runner.store.notify import CHANNEL
from tests.support.fault import load, new_instance, row, write_flow
from tests.unit.engine.test_cycle import cycle, finished

pytestmark = pytest.mark.postgres

FLOW = """\
initial: load
pools: {warehouse: 1}
states:
  load: {exec: [python, -c, "pass"], pool: warehouse, next: done}
  done: {terminal: true}
"""


@pytest.fixture
def world(pg_url: str, tmp_path: Path) -> Iterator[tuple[Engine, CompiledFlow, psycopg.Connection]]:
    engine = make_engine(pg_url)
    flow = load(write_flow(tmp_path / "flows", "wh", FLOW))
    listener = psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True)
    listener.execute(f"LISTEN {CHANNEL}")
    try:
        yield engine, flow, listener
    finally:
        listener.close()
        engine.dispose()


def _heard(listener: psycopg.Connection) -> int:
    """Notifications received on the due channel since the last call (none waits)."""
    return sum(1 for _ in listener.notifies(timeout=0.3, stop_after=None))


def test_a_release_whose_own_claim_takes_the_waiter_tells_nobody(world) -> None:
    engine, flow, listener = world
    first, second = new_instance(engine, flow), new_instance(engine, flow)
    [holder] = cycle(engine, free=4).claims  # the pool of 1: the second waits
    assert holder.id == first and row(engine, second)["waiting_for"] == "warehouse"
    _heard(listener)

    got = cycle(engine, [finished(holder, "moved", "done")], free=4)
    assert [c.id for c in got.claims] == [second], "the woken waiter, claimed at once"
    assert _heard(listener) == 0, "nobody else could take it: no daemon is sent to claim"


def test_a_release_that_leaves_the_waiter_to_others_tells_them(world) -> None:
    engine, flow, listener = world
    first, second = new_instance(engine, flow), new_instance(engine, flow)
    [holder] = cycle(engine, free=4).claims
    assert holder.id == first
    _heard(listener)

    got = cycle(
        engine, [finished(holder, "moved", "done")], free=0
    )  # no room here: others must take it
    assert got.claims == []
    r = row(engine, second)
    assert r["waiting_for"] is None and r["due_at"] is not None, "woken: due again"
    assert _heard(listener) >= 1, "the other daemons are told it is due"


def test_a_cycle_says_when_its_claim_filled_a_pool(world) -> None:
    """``CycleResult.filled``: the claim left the pool with no slot free (the worker then
    claims its whole room in one cycle, ``pacing.FILLED_FOR``); a cycle that claimed
    nothing in it does not say so."""
    engine, flow, _ = world
    new_instance(engine, flow)
    new_instance(engine, flow)
    got = cycle(engine, free=4)
    assert len(got.claims) == 1 and got.filled
    assert not cycle(engine, free=4).filled, "nothing due: nothing settled"
