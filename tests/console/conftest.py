"""The console's tests' shared fixture: the app on the fixed data of ``console_db``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.tui.app import FlowrunApp
from tests.support.console_db import build_db, clock


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FlowrunApp]:
    """A snapshot-mode console (``live=False``, the fixed ``clock``) on a real SQLite file
    holding ``build_db``'s instances, with its flows folder."""
    engine, _path, flows = build_db(tmp_path)
    yield FlowrunApp(engine, flows_dir=flows, clock=clock, live=False)
    engine.dispose()
