"""The pure retention rules (``runner.retention``) and the flow file's ``retention`` key."""

from __future__ import annotations

import pytest

from runner.errors import FlowErrors
from runner.flowspec.loader import load_flow_text
from runner.retention import (
    DAY,
    DEFAULT,
    Retention,
    Rules,
    cut_attempt,
    parse_retention,
    parse_window,
)


def test_windows_parse_durations_and_forever() -> None:
    assert parse_window("30d") == 30 * DAY
    assert parse_window(" Forever ") is None
    assert parse_window(90) == 90.0
    with pytest.raises(ValueError, match="or 'forever'"):
        parse_window("always")


def test_retention_option_forms() -> None:
    assert parse_retention("7d") == Retention(7 * DAY, 7 * DAY, 7 * DAY)
    assert parse_retention("forever") == Retention(None, None, None)
    got = parse_retention("completed=1h, failed=forever")
    assert got == Retention(3600.0, None, DEFAULT.killed)
    assert parse_retention(got.text()) == got
    with pytest.raises(ValueError, match="STATUS=WINDOW"):
        parse_retention("running=1d")


def test_rules_per_flow_and_older_than() -> None:
    rules = Rules(default=Retention(10, None, 20), flows={"f": Retention(None, 5, 20)})
    assert rules.cutoffs("g", 100) == {"completed": 90, "killed": 80}
    assert rules.cutoffs("f", 100) == {"failed": 95, "killed": 80}
    assert rules.history_cutoff("f", 100) is None and rules.history_cutoff("g", 100) == 90
    assert rules.newest_history_cutoff(["f", "g"], 100) == 90
    assert Rules(older_than=1).cutoffs("f", 100) == dict.fromkeys(
        ("completed", "failed", "killed"), 99
    )
    assert Retention().cutoff("runnable", 100) is None  # live: never


def test_history_cut_keeps_the_newest_and_open_attempts() -> None:
    base = {"attempt": 1, "last_attempt": 3, "status": "runnable", "cutoff": 100.0}
    assert cut_attempt(finished_at=50.0, **base)
    assert not cut_attempt(finished_at=150.0, **base)  # younger than the window
    assert not cut_attempt(finished_at=None, **base)  # open (a checkpoint row)
    assert not cut_attempt(finished_at=50.0, **{**base, "attempt": 3})  # the newest
    assert not cut_attempt(finished_at=50.0, **{**base, "status": "completed"})  # goes whole
    assert not cut_attempt(finished_at=50.0, **{**base, "cutoff": None})  # forever


FLOW = """flow: f
initial: a
retention: {completed: 12h, failed: forever}
states:
  a: {terminal: true}
"""


def test_flow_file_retention_key() -> None:
    spec = load_flow_text(FLOW, "f.yaml")
    assert spec.retention.overrides() == {"completed": 43200.0, "failed": None}
    bad = FLOW.replace("12h", "soon")
    with pytest.raises(FlowErrors) as err:
        load_flow_text(bad, "f.yaml")
    assert "f.yaml:3:" in str(err.value.errors[0])
    with pytest.raises(FlowErrors):
        load_flow_text(FLOW.replace("failed", "running"), "f.yaml")
