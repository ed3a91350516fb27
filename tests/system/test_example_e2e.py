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
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fault import Flowrun, daemon_running, poll

ROOT = Path(__file__).resolve().parents[2]
FLOWS = ROOT / "flows"
DEFECTIVE = {"airports.csv", "la-riots.csv", "debian-releases.csv"}

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vega_datasets") is None,
        reason="the examples need vega_datasets: pip install -e '.[examples]'",
    ),
    pytest.mark.timeout(300),
]


class ExampleRun(Flowrun):
    """``flowrun`` on a copy of the bundled flows, run to idle in the foreground."""

    def drain(self) -> None:
        """``flowrun --daemon --exit-when-idle``; it must exit 0."""
        result = self("--daemon", "--exit-when-idle", timeout=120)
        assert result.returncode == 0, f"daemon exited {result.returncode}:\n{result.stderr}"

    def instances(self) -> list[dict[str, Any]]:
        """``flowrun ls --json``."""
        result = self("ls", "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def flowrun(tmp_path: Path) -> ExampleRun:
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
    return ExampleRun(tmp_path)


def _name(instance: dict[str, Any]) -> str:
    return Path(instance["data"]["path"]).name


def test_csv_ingest_on_real_input(flowrun: ExampleRun) -> None:
    inbox, archive = flowrun.flows / "inbox", flowrun.flows / "archive"
    staged = {p.name: p.read_bytes() for p in inbox.glob("*.csv")}
    assert {"airports.csv", "la-riots.csv", "stocks.csv", "seattle-weather.csv"} <= set(staged)

    flowrun.drain()

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

    # a killed file is one line in alerts.log (the example's lifecycle sensor and its
    # exec notifier), written by the next run of the daemon
    airports = by_name["airports.csv"]
    assert flowrun("kill", str(airports["id"])).returncode == 0
    # running the README command again acts on no file twice
    flowrun.drain()
    alerts = (flowrun.flows / "alerts.log").read_text().splitlines()
    assert len(alerts) == 1, alerts
    assert f"csv_ingest instance {airports['id']} (" in alerts[0]
    assert alerts[0].split(" [event ")[0].endswith("killed in quarantine")
    again = [i for i in flowrun.instances() if i["flow"] == "csv_ingest"]
    assert sorted(i["id"] for i in again) == sorted(i["id"] for i in instances)
    assert {_name(i): i["state"] for i in again if i["state"] == "quarantine"} == {
        name: "quarantine" for name in staged if name in DEFECTIVE - {"la-riots.csv"}
    }


def test_a_file_left_in_quarantine_past_its_deadline_is_an_alert_line(
    flowrun: ExampleRun,
) -> None:
    """The example's quarantine deadline (a day, shortened here to 2 s) writes one alert
    line per file left there, and leaves it where it is."""
    flow = flowrun.flows / "csv_ingest.yaml"
    text = flow.read_text()
    assert "deadline: {after: 1d, then: alert}" in text
    flow.write_text(text.replace("deadline: {after: 1d,", "deadline: {after: 2s,"))
    alerts = flowrun.flows / "alerts.log"

    def late() -> list[str]:
        lines = alerts.read_text().splitlines() if alerts.exists() else []
        return [ln for ln in lines if "deadline_missed in quarantine" in ln]

    with daemon_running(flowrun, "example"):
        poll(lambda: len(late()) == len(DEFECTIVE), 120, what="alert lines")
    quarantined = [i for i in flowrun.instances() if i["state"] == "quarantine"]
    assert sorted(_name(i) for i in quarantined) == sorted(DEFECTIVE)
    assert {f"instance {i['id']} (" in " ".join(late()) for i in quarantined} == {True}
