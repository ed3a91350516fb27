"""The handlers of the ``csv_ingest`` example flow, on the real staged input.

The validator runs as a real subprocess (as flowrun's ``exec`` runs it: cwd = the flows
folder); ``summarise`` and ``archive`` are called with a small stand-in context.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.handler_run import run_with_control

FLOWS = Path(__file__).resolve().parents[2] / "flows"
ROOT = FLOWS.parent

#: The real defects the validator must find, per staged file (substrings of stderr).
DEFECTIVE = {
    "airports.csv": [
        "column 'city': 12 missing values ('NA') at lines 1138, 1717",
        "column 'state': 12 missing values ('NA') at lines 1138, 1717",
    ],
    "la-riots.csv": ["column 'age': 1 missing value (empty) at line 13"],
    "debian-releases.csv": ["fields, the header has 8", "column 'version': 2 missing values"],
}
VALID = {
    "iowa-electricity.csv": 51,
    "seattle-temps.csv": 8759,
    "seattle-weather.csv": 1461,
    "sf-temps.csv": 8759,
    "stocks.csv": 560,
    "us-employment.csv": 120,
}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vega_datasets") is None,
    reason="the examples need vega_datasets: pip install -e '.[examples]'",
)


def _load(name: str) -> ModuleType:
    """Import ``flows/<name>.py`` without leaving the flows folder on ``sys.path``."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", FLOWS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stage_input = _load("stage_input")
csv_tasks = _load("csv_tasks")


@pytest.fixture(scope="module")
def inbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the real input staged by ``flows/stage_input.py``."""
    folder = tmp_path_factory.mktemp("example") / "inbox"
    stage_input.stage(folder)
    return folder


def _staged(inbox: Path, name: str) -> Path:
    path = inbox / name
    if not path.exists():
        pytest.skip(f"{name} is not available on this system")
    return path


class Ctx:
    """A stand-in for flowrun's handler context."""

    def __init__(self, data: dict[str, Any], instance_id: int = 7) -> None:
        self.data = dict(data)
        self.instance_id = instance_id
        self.state = "summarise"
        self.attempt = 1
        self.cancelled = False
        self.checkpoints: list[dict[str, Any]] = []
        self.keepalives = 0

    def checkpoint(self, data: dict[str, Any]) -> None:
        self.checkpoints.append(data)
        self.data.update(data)

    def keepalive(self) -> None:
        self.keepalives += 1


def _validate(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    return subprocess.run(
        [sys.executable, "-m", "csv_validate", str(path)],
        cwd=FLOWS,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_stage_input_copies_real_files_once(inbox: Path, capsys: pytest.CaptureFixture) -> None:
    names = {p.name for p in inbox.glob("*.csv")}
    assert set(VALID) | {"airports.csv", "la-riots.csv"} <= names
    again = stage_input.stage(inbox)
    assert {action for _, _, action in again} <= {"present", "missing"}
    for name, source, action in again:
        if action == "present":
            assert (inbox / name).read_bytes() == source.read_bytes()
    assert not list(inbox.glob(".*"))  # no temporary files left behind
    assert stage_input.main(["--dest", str(inbox)]) == 0
    assert "airports.csv" in capsys.readouterr().out


def test_stage_input_skips_archived_files(tmp_path: Path) -> None:
    source = stage_input.sources()["stocks.csv"]
    (tmp_path / "archive").mkdir()
    shutil.copyfile(source, tmp_path / "archive" / "stocks.csv")
    actions = {name: action for name, _, action in stage_input.stage(tmp_path / "inbox")}
    assert actions["stocks.csv"] == "archived"
    assert not (tmp_path / "inbox" / "stocks.csv").exists()


@pytest.mark.parametrize("name", sorted(VALID))
def test_validator_passes_clean_files(inbox: Path, name: str) -> None:
    result = _validate(_staged(inbox, name))
    assert result.returncode == 0, result.stderr
    assert f"{name}: valid, {VALID[name]} data rows" in result.stdout


@pytest.mark.parametrize("name", sorted(DEFECTIVE))
def test_validator_reports_real_defects(inbox: Path, name: str) -> None:
    result = _validate(_staged(inbox, name))
    assert result.returncode == 1
    assert f"csv_validate: {name}:" in result.stderr
    for expected in DEFECTIVE[name]:
        assert expected in result.stderr


def _validate_under_flowrun(path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the validator as flowrun does: env + a control pipe; returns the control lines."""
    env = {
        "FLOWRUN_INSTANCE": "7",
        "FLOWRUN_FLOW": "csv_ingest",
        "FLOWRUN_STATE": "validate",
        "FLOWRUN_ATTEMPT": "1",
        "FLOWRUN_DATA": json.dumps({"path": str(path)}),
        "PYTHONPATH": str(ROOT),  # runner.control, also when flowrun is not pip-installed
    }
    return run_with_control([sys.executable, "-m", "csv_validate", str(path)], FLOWS, env)


def test_validator_under_flowrun_sends_defects_to_quarantine(inbox: Path) -> None:
    result, lines = _validate_under_flowrun(_staged(inbox, "la-riots.csv"))
    assert result.returncode == 0, result.stderr  # a bad file is not an error
    assert "column 'age': 1 missing value" in result.stderr  # kept on the attempt
    kind, _, payload = lines[0].partition(" ")
    assert kind == "checkpoint"
    assert json.loads(payload) == {"defects": ["column 'age': 1 missing value (empty) at line 13"]}
    assert lines[1:] == ["goto quarantine"]


def test_validator_under_flowrun_passes_clean_files(inbox: Path) -> None:
    result, lines = _validate_under_flowrun(_staged(inbox, "stocks.csv"))
    assert result.returncode == 0, result.stderr
    assert lines == ['checkpoint {"defects":[]}']


def test_validator_rejects_a_binary_file(tmp_path: Path) -> None:
    fake = tmp_path / "interpreter.csv"
    shutil.copyfile(sys.executable, fake)  # a real binary file with a .csv name
    result = _validate(fake)
    assert result.returncode == 1
    assert "not UTF-8 text" in result.stderr


def test_validator_unreadable_file_is_an_error(tmp_path: Path) -> None:
    result = _validate(tmp_path / "gone.csv", env={"FLOWRUN_INSTANCE": "1"})
    assert result.returncode == 1  # an error under flowrun too: retried, not quarantined
    assert "cannot read" in result.stderr and "gone.csv" in result.stderr


def test_validator_min_rows(inbox: Path) -> None:
    path = _staged(inbox, "iowa-electricity.csv")
    result = subprocess.run(
        [sys.executable, "-m", "csv_validate", str(path), "--min-rows", "100"],
        cwd=FLOWS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "51 data rows, at least 100 required" in result.stderr


def test_summarise_real_statistics(inbox: Path) -> None:
    path = _staged(inbox, "seattle-weather.csv")
    ctx = Ctx({"path": str(path)})
    assert csv_tasks.summarise(ctx) == "archive"
    (saved,) = ctx.checkpoints
    summary = saved["summary"]
    assert summary["rows"] == 1461
    assert summary["columns"] == "date precipitation temp_max temp_min wind weather".split()
    assert set(summary["numeric"]) == {"precipitation", "temp_max", "temp_min", "wind"}
    assert summary["text"]["weather"]["distinct"] == 5
    assert summary["text"]["date"]["distinct"] == 1461
    with path.open(newline="") as fh:
        temps = [float(row["temp_max"]) for row in csv.DictReader(fh)]
    assert summary["numeric"]["temp_max"] == {
        "min": min(temps),
        "max": max(temps),
        "mean": round(statistics.fmean(temps), 4),
    }
    json.dumps(summary)  # it goes into the instance data: must be JSON


def test_summarise_sends_keepalives_on_large_files(inbox: Path) -> None:
    ctx = Ctx({"path": str(_staged(inbox, "seattle-temps.csv"))})
    csv_tasks.summarise(ctx)
    assert ctx.keepalives == 8759 // csv_tasks.KEEPALIVE_ROWS
    temp = ctx.data["summary"]["numeric"]["temp"]
    assert temp["min"] < temp["mean"] < temp["max"]


def test_archive_moves_file_next_to_its_summary(inbox: Path, tmp_path: Path) -> None:
    source = tmp_path / "in" / "stocks.csv"
    source.parent.mkdir()
    shutil.copyfile(_staged(inbox, "stocks.csv"), source)
    original = source.read_bytes()
    archive = tmp_path / "archive"
    ctx = Ctx({"path": str(source), "archive_dir": str(archive), "summary": {"rows": 560}})
    assert csv_tasks.archive(ctx) == "done"
    assert not source.exists()
    assert (archive / "stocks.csv").read_bytes() == original
    report = json.loads((archive / "stocks.summary.json").read_text())
    assert report["file"] == "stocks.csv" and report["instance"] == 7
    assert report["summary"] == {"rows": 560}
    # a restarted attempt (file already moved, destination checkpointed) is still done
    assert csv_tasks.archive(ctx) == "done"
    assert ctx.checkpoints == [{"archived_to": str(archive / "stocks.csv")}]
    # another file of the same name does not overwrite the first one
    shutil.copyfile(_staged(inbox, "stocks.csv"), source)
    other = Ctx({"path": str(source), "archive_dir": str(archive)}, instance_id=9)
    assert csv_tasks.archive(other) == "done"
    assert (archive / "stocks-9.csv").exists() and (archive / "stocks-9.summary.json").exists()


def test_archive_of_a_vanished_file_is_an_error(tmp_path: Path) -> None:
    ctx = Ctx({"path": str(tmp_path / "gone.csv"), "archive_dir": str(tmp_path / "a")})
    with pytest.raises(FileNotFoundError):
        csv_tasks.archive(ctx)
