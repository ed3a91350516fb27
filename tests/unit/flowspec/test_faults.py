"""The fault model's one home, ``runner.flowspec.faults``: its rules with plain numbers,
and (hypothesis) ``explain``'s replay of a random history ending where the worker's
commits ended.

The property drives the real code the worker runs for each outcome (``claim_batch``,
``outcomes.decide``, ``commit.commit_outcomes``, ``leases.recover_lost`` for an attempt
whose worker died) on a real SQLite file, then replays the stored rows with
``ops.explain`` and compares the state, status and counters it ends with against the
instance row.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from runner import lifecycle
from runner.engine.outcomes import decide
from runner.error_line import error_line
from runner.flowspec import faults
from runner.flowspec.policy import Backoff
from runner.handlers.attempt import AttemptResult
from runner.ops import commands
from runner.ops.detail import instance_rows
from runner.ops.explain import explain
from runner.store import commit, leases
from runner.store.clock import DbClock, db_now, track_server_clock
from runner.store.create import create_instance
from tests.support.fault import engine_at, load, policy, row, write_flow

AT = 1_000.0


# -- the rules, with plain numbers ---------------------------------------------------------


def test_an_error_with_budget_left_backs_off() -> None:
    pol = policy(max_errors=3, window=60.0, backoff=Backoff(10.0, 2.0, 25.0, "none"))
    v = faults.error(pol, [AT - 100, AT - 30], 1, AT, "exit code 1")
    assert v.state_errors == [AT - 30, AT], "the error older than the window no longer counts"
    assert (v.status, v.event, v.backoff, v.due_at) == ("sleeping", "backoff", 2, AT + 20.0)
    assert (v.state_restarts, v.reason, v.spent, v.enter) == (1, "exit code 1", None, None)
    third = faults.error(pol, [], 0, AT, "x", rand=lambda: 0.5)
    assert third.due_at == AT + 10.0 and third.state_errors == [AT]


@pytest.mark.parametrize(
    ("on_exhausted", "status", "event", "enter", "due"),
    [
        ("failed", "failed", "exhaust_fail", None, None),
        ("paused", "paused", "exhaust_pause", None, None),
        ("rescue", "runnable", None, "rescue", AT),
    ],
)
def test_an_error_that_spends_the_budget_goes_to_on_exhausted(
    on_exhausted: str, status: str, event: str | None, enter: str | None, due: float | None
) -> None:
    pol = policy(max_errors=2, window=3600.0, on_exhausted=on_exhausted)
    v = faults.error(pol, [AT - 10], 0, AT, "exit code 1")
    assert (v.status, v.event, v.enter, v.due_at, v.backoff) == (status, event, enter, due, None)
    assert v.spent == "error budget spent (2 errors in 3600s)"
    assert v.reason == "error budget spent (2 errors in 3600s): exit code 1"
    assert error_line(v.reason) == "exit code 1", "the listings show the attempt's error"


def test_a_restart_runs_again_at_once_until_max_restarts_then_fails() -> None:
    pol = policy(max_restarts=2)
    v = faults.restart(pol, [AT - 1], 1, AT, "timeout (5s)")
    assert (v.status, v.due_at, v.state_restarts, v.event, v.spent) == (
        "runnable",
        AT,
        2,
        None,
        None,
    )
    assert (v.state_errors, v.reason) == ([AT - 1], "timeout (5s)"), "no error budget spent"
    spent = faults.restart(pol, [], 2, AT, "timeout (5s)")
    assert (spent.status, spent.due_at, spent.state_restarts, spent.event) == (
        "failed",
        None,
        3,
        "fail",
    )
    assert spent.reason == "restarts spent (3 > max_restarts 2); last: timeout (5s)"
    assert error_line(spent.reason) == "timeout (5s)"


def test_a_restart_under_an_unknown_policy_fails_at_once() -> None:
    v = faults.restart(None, [], 0, AT, "lost: worker w died mid-attempt")
    assert (v.status, v.spent) == ("failed", "restarts spent (1 > max_restarts 0)")


@pytest.mark.parametrize("used", [0, 5])
def test_a_lost_attempt_of_a_sleeping_instance_counts_and_keeps_its_status(used: int) -> None:
    """An operator put it to sleep while its worker died: the restart is counted, the
    status (and the stored due time: ``due_at`` None) kept, never failed from sleeping."""
    v = faults.restart(policy(max_restarts=1), [], used, AT, "lost", status="sleeping")
    assert (v.status, v.due_at, v.state_restarts, v.event) == ("sleeping", None, used + 1, None)


def test_not_yet_and_sleep_spend_nothing() -> None:
    pol = policy(try_interval=7.0)
    errs = [AT - 1]
    v = faults.not_yet(pol, errs, 1, AT)
    assert (v.status, v.due_at, v.state_errors, v.state_restarts, v.reason) == (
        "runnable",
        AT + 7.0,
        errs,
        1,
        None,
    )
    asleep = faults.sleep(errs, 1, AT, AT + 60)
    assert (asleep.status, asleep.due_at, asleep.event) == ("sleeping", AT + 60, "sleep")
    for past in (AT - 5, AT, None):
        assert (faults.sleep([], 0, AT, past).status, faults.sleep([], 0, AT, past).due_at) == (
            "runnable",
            AT,
        )


@pytest.mark.parametrize(
    ("jitter", "bounds"),
    [("none", (40.0, 40.0, 40.0)), ("equal", (40.0, 20.0, 40.0)), ("full", (40.0, 0.0, 40.0))],
)
def test_backoff_bounds_hold_every_delay(jitter: str, bounds: tuple) -> None:
    b = Backoff(10.0, 2.0, 40.0, jitter)
    assert b.bounds(4) == bounds, "10 * 2**3 = 80, capped at 40"
    _, low, high = bounds
    assert [b.delay(4, lambda r=r: r) for r in (0.0, 0.999)] == pytest.approx(
        [low, low + (high - low) * 0.999]
    )


# -- the property: explain's replay ends where the worker's commits ended ------------------

LEASE = 60.0
STATES = ("work", "other", "rescue", "done")
#: what happens next: an attempt's outcome ("died": its worker died, the attempt is found
#: lost once its lease expired) or an operator's ``pause`` between attempts; a failed
#: instance is retried and a paused one resumed, in its place
KINDS = ("moved", "moved", "not_yet", "sleep", "error", "error", "timeout", "lost", "died", "pause")


@pytest.fixture(scope="module")
def db() -> Iterator[tuple[Engine, Path, DbClock]]:
    """One real SQLite file for every example, its clock steerable (the commands read the
    database's clock: ``runner.store.clock``), so they apply at the simulated time."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = engine_at(Path(tmp))
        clock = track_server_clock(engine, "the simulated clock")
        clock.warned = True  # its offset is the point: no skew warning
        yield engine, Path(tmp), clock
        engine.dispose()


def _flow_body(max_errors: int, window: int, on_exhausted: str, restarts: int, jitter: str) -> str:
    return f"""\
initial: work
defaults:
  try_interval: 7s
  error_budget: {{max_errors: {max_errors}, window: {window}s, on_exhausted: {on_exhausted}}}
  backoff: {{initial: 5s, factor: 2, max: 30s, jitter: {jitter}}}
  max_restarts: {restarts}
states:
  work: {{exec: [python, -c, "pass"], next: other, to: [rescue, done]}}
  other:
    exec: [python, -c, "pass"]
    next: work
    to: [rescue, done]
    error_budget: {{max_errors: {max_errors + 1}}}
  rescue: {{exec: [python, -c, "pass"], next: work, to: [done]}}
  done: {{terminal: true}}
"""


step = st.tuples(
    st.sampled_from(KINDS),
    st.sampled_from(STATES),  # a move's target (an illegal one is an error)
    st.integers(0, 40),  # how long the attempt ran, s
    st.integers(0, 90),  # the gap before the next claim or command, s
)


def _command(
    engine: Engine, clock: DbClock, iid: int, name: str, at: float, until: float | None = None
) -> float:
    """Apply operator command ``name`` at ``at`` (simulated epoch s; ``until`` for a
    sleep); returns a whole second after it."""
    clock.offset = at - time.time()
    [res] = commands.submit(engine, [iid], name, until=until)
    assert res.ok, res.message
    return math.ceil(db_now(engine)) + 1


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    max_errors=st.integers(1, 4),
    window=st.sampled_from([20, 60, 600]),
    on_exhausted=st.sampled_from(["failed", "paused", "rescue"]),
    restarts=st.integers(0, 3),
    jitter=st.sampled_from(["none", "equal", "full"]),
    steps=st.lists(step, min_size=1, max_size=30),
)
def test_explain_replays_to_where_the_worker_ended(
    db: tuple[Engine, Path, DbClock],
    max_errors: int,
    window: int,
    on_exhausted: str,
    restarts: int,
    jitter: str,
    steps: list[tuple[str, str, int, int]],
) -> None:
    engine, tmp, clock = db
    with engine.begin() as conn:
        for table in ("attempts", "commands", "instances"):
            conn.execute(text(f"DELETE FROM {table}"))
    body = _flow_body(max_errors, window, on_exhausted, restarts, jitter)
    flow = load(write_flow(tmp / "flows", "pf", body))
    now = 1_800_000_000.0
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {}, at=now)
    for kind, target, took, gap in steps:
        r = row(engine, iid)
        if r["status"] == "completed":
            break
        if r["status"] in ("failed", "paused") or kind == "pause":
            name = {"failed": "retry", "paused": "resume"}.get(r["status"], "pause")
            now = _command(engine, clock, iid, name, now + gap)
            continue
        now = max(now, math.ceil(r["due_at"])) + gap
        with engine.begin() as conn:
            [claim] = leases.claim_batch(conn, "w1", LEASE, 1, at=now)
        if kind == "died":  # its worker died: found once the lease expired
            now += LEASE + 1
            with engine.begin() as conn:
                leases.recover_lost(conn, lambda v, s: flow.states[s].policy, at=now)
            continue
        now += took
        result = AttemptResult(
            kind,
            {"n": now},
            to_state=target if kind == "moved" else None,
            error={"error": "exit code 1", "timeout": "timeout (5s)"}.get(kind, "lost: fence"),
            sleep_until=now + 1 + took if kind == "sleep" else None,
        )
        with engine.begin() as conn:
            out = decide(flow, claim, result, claim.data, now)
            assert commit.commit_outcomes(conn, "w1", [out], at=now) == ([], [])
    end = row(engine, iid)
    track = explain(instance_rows(engine, iid), lambda v: flow, now).track
    assert track is not None
    pol = flow.states[end["state"]].policy
    replayed = (track.state, track.status, track.restarts, track.errors)
    counted = lifecycle.in_window(end["state_errors"], now, pol.window)
    assert replayed == (end["state"], end["status"], end["state_restarts"], counted)


def test_a_lost_attempt_of_an_instance_put_to_sleep_meanwhile(
    db: tuple[Engine, Path, DbClock],
) -> None:
    """An operator's sleep arrives while the attempt runs, then its worker dies: the lost
    attempt counts a restart, the instance stays sleeping (``fail`` is a move from
    ``runnable`` only), past ``max_restarts`` too; the replay says so."""
    engine, tmp, clock = db
    with engine.begin() as conn:
        for table in ("attempts", "commands", "instances"):
            conn.execute(text(f"DELETE FROM {table}"))
    flow = load(write_flow(tmp / "flows", "ps", _flow_body(2, 60, "failed", 0, "none")))
    now = 1_800_000_000.0
    with engine.begin() as conn:
        iid = create_instance(conn, flow, {}, at=now)
        leases.claim_batch(conn, "w1", LEASE, 1, at=now)
    wake = now + 3600
    now = _command(engine, clock, iid, "sleep", now + 5, until=wake)
    now += LEASE
    with engine.begin() as conn:
        [lost] = leases.recover_lost(conn, lambda v, s: flow.states[s].policy, at=now)
    assert not lost.failed
    end = row(engine, iid)
    assert (end["status"], end["due_at"], end["state_restarts"]) == ("sleeping", wake, 1)
    assert end["last_error"] == "lost: worker w1 stopped renewing its lease mid-attempt"
    result = explain(instance_rows(engine, iid), lambda v: flow, now)
    assert result.track is not None
    assert (result.track.status, result.track.restarts) == ("sleeping", 1)
    texts = [e.text for e in result.timeline]
    assert "restart 1 of 0 (no error budget spent): the instance stays sleeping" in " ".join(texts)
