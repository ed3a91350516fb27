"""End to end: the README's one command, on a copy of ``flows/`` in a temporary folder.

Stages the real input with ``flows/stage_input.py``, runs ``flowrun --daemon
--exit-when-idle`` as a real subprocess, and checks through ``flowrun ls/show --json``
that every staged file became exactly one instance: clean files archived and ``done``,
defective ones waiting in ``quarantine``; then ``flowrun send ID discard`` finishes one,
and running the daemon again starts nothing new.
"""

from __future__ import annotations

import collections
import csv
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOWS = ROOT / "flows"
DEFECTIVE = {"airports.csv", "la-riots.csv", "debian-releases.csv"}

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vega_datasets") is None,
        reason="the examples need vega_datasets: pip install -e '.[examples]'",
    ),
    pytest.mark.timeout(300),
]


def _flowrun() -> list[str]:
    """The console script next to this interpreter, else ``python -m runner.cli``."""
    script = Path(sys.executable).parent / "flowrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runner.cli"]


class Flowrun:
    """Runs ``flowrun`` with ``--flows``/``--db`` pointing into a temporary folder."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.flows = home / "flows"
        self.db = f"sqlite:///{home / 'flowrun.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.env = env

    def __call__(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = [*_flowrun(), "--flows", str(self.flows), "--db", self.db, *args]
        return subprocess.run(
            command, cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def daemon(self) -> None:
        result = self("--daemon", "--exit-when-idle", timeout=120)
        assert result.returncode == 0, f"daemon exited {result.returncode}:\n{result.stderr}"

    def instances(self) -> list[dict[str, Any]]:
        result = self("ls", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def show(self, instance_id: int) -> dict[str, Any]:
        result = self("show", str(instance_id), "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def flowrun(tmp_path: Path) -> Flowrun:
    """A copy of ``flows/`` (code only) in ``tmp_path``, with the real input staged."""
    shutil.copytree(
        FLOWS,
        tmp_path / "flows",
        ignore=shutil.ignore_patterns("inbox", "archive", "__pycache__", "*.pyc"),
    )
    staged = subprocess.run(
        [sys.executable, str(tmp_path / "flows" / "stage_input.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert staged.returncode == 0, staged.stderr
    assert "staged   airports.csv" in staged.stdout
    return Flowrun(tmp_path)


def _name(instance: dict[str, Any]) -> str:
    return Path(instance["data"]["path"]).name


def test_csv_ingest_on_real_input(flowrun: Flowrun) -> None:
    inbox, archive = flowrun.flows / "inbox", flowrun.flows / "archive"
    staged = {p.name: p.read_bytes() for p in inbox.glob("*.csv")}
    assert {"airports.csv", "la-riots.csv", "stocks.csv", "seattle-weather.csv"} <= set(staged)

    flowrun.daemon()

    instances = [i for i in flowrun.instances() if i["flow"] == "csv_ingest"]
    counts = collections.Counter(_name(i) for i in instances)
    assert counts == collections.Counter(set(staged)), "each staged file: exactly one instance"
    by_name = {_name(i): i for i in instances}
    for name, content in staged.items():
        instance = by_name[name]
        assert instance["errors"] == 0, (name, flowrun.show(instance["id"])["history"])
        if name in DEFECTIVE:
            assert instance["state"] == "quarantine", (name, instance)
            assert instance["status"] not in ("completed", "failed", "killed")
            assert instance["data"]["defects"], name
            assert (inbox / name).read_bytes() == content  # left where it was
        else:
            assert (instance["state"], instance["status"]) == ("done", "completed"), (
                name,
                flowrun.show(instance["id"])["history"],
            )
            assert not (inbox / name).exists()
            assert (archive / name).read_bytes() == content
            report = json.loads((archive / name).with_suffix(".summary.json").read_text())
            assert report["instance"] == instance["id"]
            assert report["summary"] == instance["data"]["summary"]
            rows = list(csv.reader(io.StringIO(content.decode("utf-8"))))
            assert report["summary"]["rows"] == len(rows) - 1

    riots = by_name["la-riots.csv"]
    assert riots["data"]["defects"] == ["column 'age': 1 missing value (empty) at line 13"]
    history = flowrun.show(riots["id"])["history"]
    assert [(h["state"], h["outcome"], h["to_state"]) for h in history] == [
        ("validate", "moved", "quarantine")
    ]

    # an event the state has no edge for is refused; discard finishes a quarantined one
    assert flowrun("send", str(by_name["stocks.csv"]["id"]), "release").returncode == 2
    result = flowrun("send", str(riots["id"]), "discard")
    assert result.returncode == 0, result.stderr
    shown = flowrun.show(riots["id"])
    assert (shown["state"], shown["status"]) == ("done", "completed")

    # running the README command again acts on no file twice
    flowrun.daemon()
    again = [i for i in flowrun.instances() if i["flow"] == "csv_ingest"]
    assert sorted(i["id"] for i in again) == sorted(i["id"] for i in instances)
    assert {_name(i): i["state"] for i in again if i["state"] == "quarantine"} == {
        name: "quarantine" for name in staged if name in DEFECTIVE - {"la-riots.csv"}
    }
