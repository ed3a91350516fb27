"""runner.flowspec.setup_checks: what a daemon refuses of a flow with ``user``/``group``
as it loads it. A daemon not running as root cannot be started here (the interpreter is
in root's home), so its effective uid is the one boundary replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.flowspec import setup_checks
from runner.flowspec.registry import FlowRegistry

FLOW = """\
flow: drop
initial: a
states:
  a:
    exec: [id]
    user: nobody
    next: b
  b: {terminal: true}
"""


def test_a_daemon_not_running_as_root_refuses_user_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "drop.yaml").write_text(FLOW)
    monkeypatch.setattr(setup_checks.os, "geteuid", lambda: 1000)
    registry = FlowRegistry(tmp_path, check=setup_checks.privilege_errors)
    [error] = registry.load_all()
    assert str(error) == (
        f"{tmp_path / 'drop.yaml'}:6:11: user 'nobody' needs a daemon running as root "
        "(this one runs as uid 1000): the state's handlers cannot run"
    )
    assert registry.flows == {}


def test_as_root_a_known_user_loads_and_check_alone_accepts_it(tmp_path: Path) -> None:
    (tmp_path / "drop.yaml").write_text(FLOW)
    registry = FlowRegistry(tmp_path, check=setup_checks.privilege_errors)
    assert registry.load_all() == []
    assert list(registry.flows) == ["drop"]
    assert FlowRegistry(tmp_path).load_all() == []  # flowrun check: no privilege check
