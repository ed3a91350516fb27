"""A SQLite database the set-up does not let flowrun use is a configuration error: one
line, exit 2 (which the shipped systemd unit does not restart), never a traceback and
never 75 ("try again": it would not help).

Real folders, a real read-only bind mount (root only: skipped with the reason elsewhere),
real ``flowrun`` processes.
"""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.fault import ROOT, Flowrun, write_flow

FLOW = """\
initial: s1
states:
  s1: {call: "setup_tasks:run", next: done}
  done: {terminal: true}
"""


def _world(tmp_path: Path) -> Flowrun:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "job", FLOW, {"setup_tasks": "def run(ctx):\n    return True\n"})
    return fr


def _one_line(res: subprocess.CompletedProcess, code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_a_sqlite_folder_that_cannot_be_created_is_one_line_and_exit_2(tmp_path: Path):
    fr = _world(tmp_path)
    (tmp_path / "taken").write_text("a file where the folder would go")
    fr.db = f"sqlite:///{tmp_path / 'taken' / 'sub' / 'flowrun.db'}"
    for args in (("start", "job"), ("--daemon", "--exit-when-idle")):
        line = _one_line(fr(*args), 2)
        assert line == (
            f"flowrun: database {fr.db}: cannot create its folder {tmp_path / 'taken' / 'sub'}: "
            "Not a directory"
        ), args


@contextmanager
def read_only_view(folder: Path, view: Path) -> Iterator[Path]:
    """``folder`` bind-mounted read-only at ``view`` for the block (skips where mounting is
    not permitted)."""
    view.mkdir()
    res = subprocess.run(
        ["mount", "--bind", str(folder), str(view)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {res.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


@pytest.mark.parametrize("open_elsewhere", [True, False])
def test_a_read_only_database_is_a_configuration_error(tmp_path: Path, open_elsewhere: bool):
    """Read-only with its -wal and -shm files present (another process has it open: the
    writes fail) and without them (it cannot even be opened): exit 2 both."""
    home = tmp_path / "home"
    fr = _world(home)
    assert fr("start", "job").returncode == 0  # the database exists, with one instance
    keep = sqlite3.connect(home / "flowrun.db") if open_elsewhere else None
    try:
        if keep is not None:
            keep.execute("SELECT count(*) FROM instances").fetchone()  # -wal and -shm exist
            assert (home / "flowrun.db-shm").exists()
        with read_only_view(home, tmp_path / "view") as view:
            fr.db = f"sqlite:///{view / 'flowrun.db'}"
            for args in (("start", "job"), ("--daemon", "--exit-when-idle")):
                line = _one_line(fr(*args), 2)
                if open_elsewhere:
                    assert "the database is read-only: attempt to write a readonly" in line
                else:
                    assert "unable to open database file" in line
    finally:
        if keep is not None:
            keep.close()


def test_the_shipped_unit_does_not_restart_a_configuration_error():
    unit = (ROOT / "contrib" / "systemd" / "flowrun.service").read_text()
    prevent = [ln for ln in unit.splitlines() if ln.startswith("RestartPreventExitStatus=")]
    assert prevent and "2" in prevent[0].split("=", 1)[1].split()
