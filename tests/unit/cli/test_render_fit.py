"""What ``show``'s attempts table and ``events`` keep at 80 columns (``runner.cli.render``):
names that tell rows apart (a state moved to, a sensor) are not cut while a column of
nothing or a long line could give room."""

from __future__ import annotations

import pytest

from runner.cli import render

ATTEMPT = {
    "attempt": 1,
    "state": "validate",
    "worker": "buildhost-7:123456",
    "started_at": "2026-11-27T23:06:06.970Z",
    "duration": 1.012,
    "outcome": "moved",
    "to_state": "quarantine",
    "error": None,
    "env": None,
    "secrets": None,
}

INSTANCE = {
    "id": 2,
    "flow": "csv_ingest",
    "label": "inbox/la-riots.csv",
    "version": "56263a5cdc839ce6",
    "state": "quarantine",
    "status": "runnable",
    "attempts": 1,
    "errors": 0,
    "restarts": 0,
    "due_at": None,
    "locked_by": None,
    "locked_until": None,
    "created_at": "2026-11-27T23:06:06.691Z",
    "updated_at": "2026-11-27T23:06:07.982Z",
    "waiting_for": None,
    "priority": 5,
    "waits_for": ["release", "discard"],
    "last_error": None,
    "budget": None,
    "data": {},
}


def _attempt_rows(out: str) -> list[str]:
    lines = out.splitlines()
    head = lines.index("attempts") + 1
    return lines[head:]


def test_show_without_errors_has_no_error_column_and_keeps_the_state_moved_to(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    render.instance_detail({**INSTANCE, "history": [ATTEMPT]})
    rows = _attempt_rows(capsys.readouterr().out)
    assert all(len(line) <= 80 for line in rows), rows
    assert rows[0].split() == ["#", "state", "worker", "started", "secs", "outcome", "to"], rows
    assert rows[1].split()[-2:] == ["moved", "quarantine"], rows
    assert ATTEMPT["started_at"] in rows[1], rows


def test_show_with_an_error_keeps_the_error_column(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    failed = {**ATTEMPT, "attempt": 2, "outcome": "error", "to_state": None, "error": "boom"}
    render.instance_detail({**INSTANCE, "history": [ATTEMPT, failed]})
    rows = _attempt_rows(capsys.readouterr().out)
    assert rows[0].split()[-1] == "error" and rows[2].split()[-1] == "boom", rows


def test_events_at_80_columns_cut_the_line_before_the_sensor(capsys) -> None:
    """Two sensors of one flow cut to ``csv_ingest.…`` tell nothing apart: the line (what
    happened) shrinks first, down to its least width."""
    rows = [
        {
            "id": 9,
            "sensor": "csv_ingest.lifecycle",
            "what": "debian-releases.csv (1220 bytes) in /tmp/a24p-clone/flows/inbox",
            "created_at": "2026-11-27T23:06:06.691Z",
            "handled_at": "2026-11-27T23:06:06.700Z",
            "action": "started csv_ingest instance 9",
        },
        {
            "id": 8,
            "sensor": "csv_ingest.inbox",
            "what": "stocks.csv (12245 bytes) in /tmp/a24p-clone/flows/inbox",
            "created_at": "2026-11-27T23:06:06.691Z",
            "handled_at": None,
            "action": None,
        },
    ]
    render.events_table(rows, width=80)
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].split()[:2] == ["9", "csv_ingest.lifecycle"], lines
    assert lines[2].split()[:2] == ["8", "csv_ingest.inbox"], lines
    assert "debian-releases.csv (1" in lines[1], lines


def test_ls_at_80_columns_says_what_a_quarantined_file_waits_for(capsys) -> None:
    """README's first command ends with ``flowrun ls`` piped (80 columns): files in
    ``quarantine`` (runnable, nothing due) say which events they wait for; a last error
    column of nothing took that room."""
    names = ["seattle-temps", "la-riots", "airports", "iowa-electricity", "debian-releases"]
    rows = [
        {
            **INSTANCE,
            "id": i,
            "label": f"inbox/{name}.csv",
            "state": "quarantine" if i % 2 == 0 else "done",
            "status": "runnable" if i % 2 == 0 else "completed",
            "running_attempt": None,
        }
        for i, name in enumerate(names, start=1)
    ]
    waits = {r["id"]: ("release", "discard") for r in rows if r["state"] == "quarantine"}
    render.instance_table(rows, width=80, waits=waits)
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert "last error" not in lines[0] and "due in" in lines[0], lines
    for line in lines[1:-1]:
        quarantined = " quarantine " in line
        assert ("on release|discard" in line) == quarantined, lines
        assert "inbox/" in line and "…" not in line, lines
    # a row with an error brings its column back
    rows[1]["last_error"] = "exit code 1: boom"
    render.instance_table(rows, width=80, waits=waits)
    assert "last error" in capsys.readouterr().out.splitlines()[0]
