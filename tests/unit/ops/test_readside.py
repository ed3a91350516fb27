"""The read side's small parts: the one dialect object per database, the engine factory
(``readonly``), the ``ls`` table's column fitting and the due column's words."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from runner.cli.columns import fit_columns
from runner.cli.render import INSTANCE_COLUMNS, SHRINK_ORDER
from runner.store.db import make_engine, read_engine
from runner.store.dialect import SQLITE, dialect_of
from runner.tui import fmt

NOW = 1_700_000_000.0


def test_dialect_name_is_asked_in_one_module_only() -> None:
    root = Path(__file__).resolve().parents[3] / "runner"
    askers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if re.search(r"dialect\.name\b", p.read_text())
    )
    assert askers == ["store/dialect.py"]


def test_sqlite_engines_share_one_dialect_and_readonly_cannot_write(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    engine = make_engine(url)
    assert dialect_of(engine) is SQLITE and dialect_of(engine.connect()) is SQLITE
    for reader in (make_engine(url, readonly=True), read_engine(engine)):
        assert reader is not engine and dialect_of(reader) is SQLITE
        with reader.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM instances")).scalar() == 0
        with pytest.raises(OperationalError), reader.connect() as conn:
            conn.execute(text("DELETE FROM instances"))
        reader.dispose()
    memory = make_engine("sqlite://")
    assert read_engine(memory) is memory, "a second in-memory engine is another database"


def test_readonly_engine_creates_no_folder(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'absent' / 'r.db'}", readonly=True)
    with pytest.raises(OperationalError), engine.connect() as conn:
        conn.execute(text("SELECT 1 FROM instances"))
    assert not (tmp_path / "absent").exists()


NATURAL = {
    "id": 5,
    "flow": 30,
    "label": 20,
    "state": 30,
    "status": 8,
    "attempts": 3,
    "errors": 3,
    "restarts": 3,
    "due": 6,
    "lock": 20,
    "last_error": 60,
}


@pytest.mark.parametrize("width", [250, 120, 80, 60, 40, 10])
def test_columns_shrink_then_drop_but_id_and_status_stay(width: int) -> None:
    shown = fit_columns(INSTANCE_COLUMNS, NATURAL, width, SHRINK_ORDER)
    assert "id" in shown and "status" in shown
    assert list(shown) == [k for k in NATURAL if k in shown], "table order kept"
    used = sum(shown.values()) + 2 * (len(shown) - 1)
    if width >= 40:
        assert used <= width
    assert all(shown[k] <= NATURAL[k] for k in shown)
    if width == 250:
        assert shown == NATURAL


def test_at_80_columns_the_label_and_the_error_stay_and_the_label_is_not_cut() -> None:
    shown = fit_columns(INSTANCE_COLUMNS, NATURAL, 80, SHRINK_ORDER)
    assert {"id", "label", "status", "last_error"} <= set(shown), shown
    assert shown["label"] == NATURAL["label"] and shown["last_error"] >= 20, shown
    assert "lock" not in shown and "restarts" not in shown  # worth less to an operator
    # a dropped column gives its room back
    assert sum(shown.values()) + 2 * (len(shown) - 1) > 70, shown


def test_due_words_are_never_negative_nor_event_when_paused() -> None:
    assert fmt.due_in(NOW - 5, NOW, "runnable") == "now"
    assert fmt.due_in(NOW - 5, NOW, "runnable", running=True) == "running"
    assert fmt.due_in(None, NOW, "runnable") == "event"
    assert fmt.due_in(None, NOW, "paused") == "" and fmt.due_in(NOW - 5, NOW, "paused") == ""
    assert fmt.due_in(NOW + 12, NOW, "sleeping") == "12s"
