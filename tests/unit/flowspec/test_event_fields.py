"""Event fields are known at ``check`` time: each sensor kind's fields (verified here
against what the real sensors write), rules naming unknown ones rejected with a position
and the list of fields, and ``{event.x}`` in a selector regex rendered (escaped)."""

from __future__ import annotations

import json
from pathlib import Path

from runner.errors import FlowErrors
from runner.flowspec.compiler import compile_source
from runner.flowspec.spec_sensors import EVENT_FIELDS
from tests.support.sensor_hub import (
    engine_at,
    rows,
    running_hub,
    scalar,
    settled,
    wait_until,
    write_flow,
)

HEAD = """\
flow: f
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""


def errors(body: str) -> list[str]:
    try:
        compile_source(HEAD + body, "f.yaml")
    except FlowErrors as exc:
        return [str(e) for e in exc.errors]
    return []


def test_unknown_clock_field_is_rejected_with_position_and_fields() -> None:
    got = errors(
        "sensors:\n  clk: {every: 5m}\nrules:\n"
        '  - {when: clk, start: f, data: {at: "{event.at}", t: "{event.tick}"}}\n'
    )
    assert got == [
        "f.yaml:9:38: {event.at} is not a field of clock sensor 'clk' events "
        "(fields: tick, scheduled, missed)"
    ]


def test_tail_groups_are_fields_and_match_keys_are_checked() -> None:
    body = (
        "sensors:\n  log: {tail: {path: a.log, match: 'E (?P<code>\\d{3})'}}\nrules:\n"
        '  - {when: log, match: {cod: "^5"}, start: f, data: {c: "{event.code}"}}\n'
    )
    got = errors(body)
    assert len(got) == 1 and got[0].startswith("f.yaml:9:25: match key 'cod'")
    assert "(did you mean 'code'?) (fields: code, line, file, host)" in got[0]
    assert errors(body.replace("cod:", "code:")) == []


def test_files_fields_and_selector_regex_refs() -> None:
    body = (
        "sensors:\n  inbox: {files: {path: in}}\nrules:\n"
        '  - {when: inbox, send: {event: go, data: {path: "^{event.pth}$"}}}\n'
    )
    got = errors(body)
    assert len(got) == 1 and "{event.pth} is not a field of files sensor 'inbox'" in got[0]
    assert "(fields: path, name, size, host)" in got[0]
    assert errors(body.replace("pth", "path")) == []


def _keys(engine) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for sensor, payload in rows(engine, "SELECT sensor, payload FROM events"):
        out.setdefault(sensor, set()).update(json.loads(payload))
    return out


async def test_the_sensors_write_exactly_the_documented_fields(tmp_path: Path) -> None:
    """The truth is the code: run a files, a tail and a clock sensor for real."""
    flows = tmp_path / "flows"
    write_flow(
        flows,
        "f",
        "sensors:\n"
        "  inbox: {files: {path: inbox, settle: 50ms}}\n"
        "  log: {tail: {path: app.log, from: start}}\n"
        "  clk: {every: 200ms}\n",
    )
    (flows / "inbox").mkdir()
    (flows / "inbox" / "a.txt").write_text("x")
    (flows / "app.log").write_text("a line\n")
    engine = engine_at(tmp_path)
    async with running_hub(engine, flows) as hub:
        await wait_until(lambda: len(_keys(engine)) == 3)
        await settled(hub)
    keys = _keys(engine)
    assert keys["f.inbox"] == set(EVENT_FIELDS["files"])
    assert keys["f.log"] == set(EVENT_FIELDS["tail"])
    assert keys["f.clk"] == set(EVENT_FIELDS["every"]) == set(EVENT_FIELDS["cron"])


SELECT_FLOW = """\
sensors:
  inbox: {files: {path: inbox, glob: "*.go", settle: 50ms}}
rules:
  - when: inbox
    send: {event: go, data: {path: "^{event.name}$"}}
"""


async def test_selector_regex_matches_the_event_value_literally(tmp_path: Path) -> None:
    flows = tmp_path / "flows"
    write_flow(flows, "f", SELECT_FLOW)
    (flows / "inbox").mkdir()
    engine = engine_at(tmp_path)
    from runner.flowspec.registry import FlowRegistry
    from runner.store.create import create_instance

    reg = FlowRegistry(flows)
    assert not reg.load_all()
    with engine.begin() as conn:
        for path in ("a+b.go", "aab.go", "x.go"):
            create_instance(conn, reg.get("f"), {"path": path})
    async with running_hub(engine, flows) as hub:
        (flows / "inbox" / "a+b.go").write_text("x")  # '+' is a regex operator
        await wait_until(lambda: scalar(engine, "SELECT count(*) FROM events") == 1)
        await settled(hub)
    done = rows(engine, "SELECT json_extract(data, '$.path') FROM instances WHERE state='done'")
    assert done == [("a+b.go",)]
