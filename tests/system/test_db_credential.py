"""The database URL from a systemd credential: ``$CREDENTIALS_DIRECTORY/flowrun-db`` is
read when neither ``--db`` nor ``FLOWRUN_DB`` is given (real ``flowrun`` processes, real
SQLite files)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.fault import Flowrun, db_url, flowrun_cmd, write_flow

FLOW = """\
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""


def _flowrun(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*flowrun_cmd(), "--flows", str(home / "flows"), *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_database_url_comes_from_the_credential(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "web", FLOW)
    assert fr("start", "web").returncode == 0  # instance 1, in tmp_path/flowrun.db
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "flowrun-db").write_text(db_url(tmp_path) + "\n")
    creds.joinpath("flowrun-db").chmod(0o600)
    env = {**fr.env, "CREDENTIALS_DIRECTORY": str(creds)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "flows").mkdir()
    # no --db, no FLOWRUN_DB: the credential's database, not ./.flowrun/flowrun.db
    res = _flowrun(elsewhere, env, "show", "1", "--json")
    assert res.returncode == 0, res.stderr
    assert '"flow": "web"' in res.stdout
    assert not (elsewhere / ".flowrun").exists()
    # --db and FLOWRUN_DB win over it
    other = f"sqlite:///{tmp_path / 'other.db'}"
    for res in (
        _flowrun(elsewhere, env, "--db", other, "ls"),
        _flowrun(elsewhere, {**env, "FLOWRUN_DB": other}, "ls"),
    ):
        assert res.returncode == 0, res.stderr  # an empty listing
        assert "0 instances" in res.stdout and "other.db" in res.stderr


def test_an_empty_credential_is_one_line(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "flowrun-db").write_text("\n")
    (tmp_path / "flows").mkdir()
    env = {**Flowrun(tmp_path).env, "CREDENTIALS_DIRECTORY": str(creds)}
    res = _flowrun(tmp_path, env, "ls")
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"flowrun: {creds / 'flowrun-db'}: empty; it should hold the database URL"
    )
