"""By default the daemon says, in one WARNING line each naming instance, flow and state,
when an instance failed (error budget or restarts spent) and when a command killed an
instance whose attempt it was running; `--log-attempts` lines carry the error line.
Real daemon, real handlers, real SQLite file; JSON lines read back as fields."""

from __future__ import annotations

import json

import pytest

from tests.support.fault import Flowrun, daemon_running, poll, write_flow

pytestmark = pytest.mark.timeout(300)

FLOW = """\
initial: work
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  work: {exec: [python, handler.py, "{data.mode}"], next: done}
  done: {terminal: true}
"""

HANDLER = """\
import sys, time
if sys.argv[1] == "sleep":
    time.sleep(120)
for i in range(80):
    print(f"noise line {i:02d}: " + "x" * 60, file=sys.stderr)
print("RuntimeError: the real cause", file=sys.stderr)
sys.exit(1)
"""

CAUSE = "exit code 1: RuntimeError: the real cause"


def _records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_failed_and_killed_are_one_warning_each(tmp_path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "wflow", FLOW, {"handler": HANDLER})
    failing = int(fr("start", "wflow", "mode=fail").stdout)
    sleeping = int(fr("start", "wflow", "mode=sleep").stdout)
    with daemon_running(fr, "warn", "--log-format", "json", "--log-attempts") as daemon:
        poll(lambda: fr.show(failing)["status"] == "failed", 60, what="failed")
        poll(lambda: fr.show(sleeping)["locked_by"], 60, what="sleeper running")
        assert fr("kill", str(sleeping)).returncode == 0
        poll(lambda: any(r.get("kind") == "killed" for r in _records(daemon.log())), 60)
        records = _records(daemon.log())
    warnings = [r for r in records if r["level"] == "warning" and "kind" in r]
    by_kind = {r["kind"]: r for r in warnings}
    assert sorted(by_kind) == ["budget_spent", "killed"], warnings
    failed, killed = by_kind["budget_spent"], by_kind["killed"]
    assert (failed["instance"], failed["flow"], failed["state"]) == (failing, "wflow", "work")
    assert failed["msg"] == (
        f"instance {failing} (flow wflow, state work): failed: error budget spent "
        f"(1 errors in 14400s): {CAUSE}"
    )
    assert (killed["instance"], killed["flow"], killed["state"]) == (sleeping, "wflow", "work")
    assert killed["msg"].startswith(f"instance {sleeping} (flow wflow, state work): killed")
    assert sum(r["instance"] == failing for r in warnings) == 1  # one line, not one a part
    # --log-attempts: the attempt's line carries its error line, as text and as a field
    [attempt] = [
        r for r in records if r["logger"] == "flowrun.attempts" and r["instance"] == failing
    ]
    assert attempt["error"] == CAUSE and attempt["msg"].endswith(CAUSE)


def test_text_log_names_instance_and_flow(tmp_path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "wflow", FLOW, {"handler": HANDLER})
    failing = int(fr("start", "wflow", "mode=fail").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    lines = [ln for ln in res.stderr.splitlines() if "WARNING" in ln]
    assert len(lines) == 1, res.stderr
    assert f"instance {failing} (flow wflow, state work): failed: error budget spent" in lines[0]
    assert lines[0].endswith(CAUSE) and "noise line" not in res.stderr


SPENT = """\
initial: work
defaults:
  error_budget: {max_errors: 1, on_exhausted: fallback}
  max_restarts: 0
states:
  work: {exec: [python, handler.py, "{data.mode}"], next: done, timeout: 1s}
  fallback: {external: true, on: {ok: done}}
  done: {terminal: true}
"""


def test_spent_restarts_and_budget_name_their_kind(tmp_path) -> None:
    """A timeout past max_restarts is kind restarts_spent; a spent budget whose
    on_exhausted enters a state is kind budget_spent (the instance is not failed: it is
    still one line)."""
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "spent", SPENT, {"handler": HANDLER})
    stuck = int(fr("start", "spent", "mode=sleep").stdout)
    erring = int(fr("start", "spent", "mode=fail").stdout)
    res = fr("--daemon", "--exit-when-idle", "--log-format", "json", timeout=120)
    warnings = [r for r in _records(res.stderr) if r["level"] == "warning" and "kind" in r]
    by_instance = {r["instance"]: r for r in warnings}
    assert len(warnings) == 2, warnings
    assert by_instance[stuck]["kind"] == "restarts_spent"
    assert by_instance[stuck]["msg"].startswith(
        f"instance {stuck} (flow spent, state work): failed"
    )
    assert by_instance[erring]["kind"] == "budget_spent"
    assert "state work): entered 'fallback': error budget spent" in by_instance[erring]["msg"]
