"""``flowrun events replay`` and ``flowrun rules test`` against a real ``flowrun --daemon``
with real files and tail sensors on a real SQLite file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.fault import (
    Daemon,
    Flowrun,
    daemon_running,
    engine_at,
    poll,
    sql,
    write_flow,
)

pytestmark = pytest.mark.timeout(300)

FLOW = """\
initial: hold
states:
  hold: {external: true, on: {go: done}}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.csv", settle: 100ms}}
  log: {tail: {path: app.log, match: '(?P<level>ERROR|INFO) (?P<msg>.*)'}}
rules:
  - when: inbox
    start: ingest
    data: {path: "{event.path}", origin: "{event.name}", size: "{event.size}"}
  - when: log
    match: {level: ERROR}
    pause: {state: hold}
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Flowrun, Daemon]]:
    home = tmp_path_factory.mktemp("replay")
    fr = Flowrun(home)
    write_flow(fr.flows, "ingest", FLOW)
    (fr.flows / "inbox").mkdir()
    (fr.flows / "app.log").write_text("")
    with daemon_running(fr, "replay") as daemon:
        # a tail sensor reads from the end it found: lines written before it watches are
        # not events (each test may run alone, ``-k``)
        poll(lambda: "sensors ready" in daemon.log(), 60, what="sensors ready")
        yield fr, daemon


def _counts(fr: Flowrun) -> tuple:
    db = engine_at(fr.home)
    return tuple(
        sql(db, f"SELECT COUNT(*) FROM {t}")[0][0] for t in ("instances", "commands", "events")
    )


def _events(fr: Flowrun) -> list[dict]:
    res = fr("events", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_replay_is_idempotent_unless_forced(live) -> None:
    fr, _ = live
    db = engine_at(fr.home)
    (fr.flows / "inbox" / "a.csv").write_text("x\n1\n")
    poll(lambda: sql(db, "SELECT COUNT(*) FROM instances WHERE event_id IS NOT NULL")[0][0], 60)
    [file_event] = [e for e in _events(fr) if e["sensor"] == "ingest.inbox"]
    eid = str(file_event["id"])

    res = fr("events", "replay", eid)
    assert res.returncode == 0, res.stderr
    assert "skipped (this event already started a ingest instance" in res.stdout
    assert sql(db, "SELECT COUNT(*) FROM instances")[0][0] == 1

    before = _counts(fr)
    res = fr("events", "replay", eid, "--dry-run", "--force")
    assert res.returncode == 0, res.stderr
    assert "dry run: nothing written" in res.stdout
    assert '"origin": "a.csv"' in res.stdout and "would start ingest" in res.stdout
    assert _counts(fr) == before

    res = fr("events", "replay", eid, "--force", "--json")
    assert res.returncode == 0, res.stderr
    [out] = json.loads(res.stdout)
    assert out["rules"][0]["done"].startswith("started ingest instance")
    rows = sql(db, "SELECT id, event_id FROM instances ORDER BY id")
    assert [r[1] for r in rows] == [file_event["id"]] * 2
    # a template that is one placeholder keeps the value's type: the size stays a number
    shown = json.loads(fr("ls", "--json").stdout)
    assert [r["data"]["size"] for r in shown] == [4, 4]
    assert [r["data"]["origin"] for r in shown] == ["a.csv", "a.csv"]
    action = sql(db, "SELECT action FROM events WHERE id = :i", i=file_event["id"])[0][0]
    assert "replayed at" in action and "started ingest instance" in action

    # a command rule: the log line pauses every instance in `hold`
    with (fr.flows / "app.log").open("a") as f:
        f.write("ERROR disk full\n")
    poll(
        lambda: sql(db, "SELECT COUNT(*) FROM instances WHERE status = 'paused'")[0][0] == 2,
        60,
        what="paused by the rule",
    )
    [log_event] = [e for e in _events(fr) if e["sensor"] == "ingest.log"]
    res = fr("resume", "--flow", "ingest")
    assert res.returncode == 0, res.stderr
    res = fr("events", "replay", str(log_event["id"]))
    assert res.returncode == 0, res.stderr
    assert "already applied for this event to instances 1, 2" in res.stdout
    assert sql(db, "SELECT COUNT(*) FROM instances WHERE status = 'paused'")[0][0] == 0
    res = fr("events", "replay", str(log_event["id"]), "--force")
    assert res.returncode == 0, res.stderr
    assert "did: pause: 2 of 2 ingest instances" in res.stdout
    assert sql(db, "SELECT COUNT(*) FROM instances WHERE status = 'paused'")[0][0] == 2
    sources = sql(db, "SELECT DISTINCT source FROM commands WHERE command = 'pause'")
    assert sources == [("rule:ingest#2",)]

    res = fr("events", "replay", "--since", "1h", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"event {file_event['id']} of ingest.inbox" in res.stdout
    assert f"event {log_event['id']} of ingest.log" in res.stdout

    res = fr("events", "replay", "424242")
    assert res.returncode == 1 and res.stderr.strip() == "flowrun: no event 424242"
    res = fr("events", "replay")
    assert res.returncode == 2 and "give event ids or --since" in res.stderr
    res = fr("events", "--limit", "1")  # the listing is still the group's default
    assert res.returncode == 0 and "ingest.log" in res.stdout


def test_rules_test_writes_nothing(live) -> None:
    fr, _ = live
    before = _counts(fr)
    res = fr("rules", "test", "ingest", "--sensor", "log", "--line", "ERROR out of memory")
    assert res.returncode == 0, res.stderr
    assert "rule #1 (when inbox): no match: listens to 'inbox'" in res.stdout
    assert "rule #2 (when log): would pause:" in res.stdout
    assert '"msg": "out of memory"' in res.stdout
    res = fr("rules", "test", "ingest", "--sensor", "log", "--line", "INFO all good", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [r["matched"] for r in out["rules"]] == [False, False]
    assert out["rules"][1]["why"] == "field 'level' ('INFO') does not match 'ERROR'"
    res = fr("rules", "test", "ingest", "--sensor", "inbox", "--path", "inbox/b.csv")
    assert res.returncode == 0, res.stderr
    assert "would start ingest with data" in res.stdout and '"origin": "b.csv"' in res.stdout
    res = fr("rules", "test", "ingest", "--sensor", "inbox", "--event", '{"name": "c.csv"}')
    assert res.returncode == 1, res.stdout
    assert (
        "rule #1 (when inbox): matches, but fails: the event has no field 'path' "
        "(named by {event.path})" in res.stdout
    )
    res = fr(
        "rules", "test", "ingest", "--sensor", "inbox", "--event", '{"name": "c.csv"}', "--json"
    )
    assert res.returncode == 1
    assert json.loads(res.stdout)["rules"][0]["error"].startswith("the event has no field 'path'")
    for args, message in (
        (("--sensor", "log", "--line", "DEBUG x"), "would not record this line"),
        (("--sensor", "inbox", "--path", "b.txt"), "does not match glob '*.csv'"),
        (("--sensor", "nope", "--event", "{}"), "has no sensor 'nope' (sensors: inbox, log)"),
        (("--sensor", "log", "--path", "b.csv"), "--path needs a files sensor"),
        (("--sensor", "log"), "exactly one of --event, --line or --path"),
        (("--sensor", "inbox", "--event", "[1]"), "--event must be a JSON object"),
    ):
        res = fr("rules", "test", "ingest", *args)
        assert res.returncode == 2, (args, res.stdout)
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = fr("rules", "test", "nosuchflow", "--sensor", "x", "--event", "{}")
    assert res.returncode == 2
    assert _counts(fr) == before


def test_events_text_says_what_happened(live) -> None:
    """``flowrun events`` shows each event's line or file (literally), not just its key."""
    fr, _ = live
    line = "INFO [cache] code=502 evicted [/var/lib/app] entries"
    with (fr.flows / "app.log").open("a") as f:
        f.write(line + "\n")
    (fr.flows / "inbox" / "what.csv").write_text("x\n1\n")

    def both() -> list[dict]:
        found = [e for e in _events(fr) if e["what"] == line or "what.csv" in e["what"]]
        return found if len(found) == 2 else []

    events = {e["sensor"]: e for e in poll(both, 60, what="both events stored")}
    assert events["ingest.log"]["payload"]["line"] == line
    path = events["ingest.inbox"]["payload"]["path"]
    assert events["ingest.inbox"]["what"] == f"what.csv (4 bytes) in {fr.flows / 'inbox'}"
    assert path == str(fr.flows / "inbox" / "what.csv")
    # at 80 columns the "what" cell gets what the others leave (their widths follow the
    # values, e.g. ``handled``: pending, +12ms, +1.2s): a cut line, at least 20 characters
    for columns, shown in (("200", line), ("80", line[:20])):
        res = subprocess.run(
            fr.argv("events", "--limit", "2"),
            env={**fr.env, "COLUMNS": columns},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0 and "Traceback" not in res.stderr, res
        out = res.stdout.splitlines()
        assert out[0].split()[:3] == ["id", "sensor", "what"], out
        rows = {ln.split()[0]: ln for ln in out[1:]}
        assert shown in rows[str(events["ingest.log"]["id"])], res.stdout
        assert "what.csv (4 bytes)" in rows[str(events["ingest.inbox"]["id"])], res.stdout
