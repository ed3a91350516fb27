"""runner.flowspec.spec and runner.durations: models, defaults, every load error's position."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runner.durations import format_duration, parse_duration
from runner.errors import FlowError, FlowErrors
from runner.flowspec.loader import load_flow_text
from runner.flowspec.spec import FlowSpec, StateSpec

EXAMPLE = """\
# yaml-language-server: $schema=../schemas/flow.schema.json
flow: csv_ingest
description: Validate CSV files dropped into inbox/, summarise, archive.
initial: validate
data: {min_rows: 1}
defaults:
  try_interval: 30s
  timeout: 5m
  keepalive: null
  error_budget: {max_errors: 8, window: 4h, on_exhausted: failed}
  backoff: {initial: 10s, factor: 2, max: 10m, jitter: full}
  max_restarts: 5
states:
  validate:
    exec: [python, -m, examples.validate_csv, "{data.path}"]
    next: summarise
  summarise:
    call: examples.tasks:summarise
    to: [archive, quarantine]
    keepalive: 20s
  archive:
    exec: [python, -m, examples.archive, "{data.path}"]
    next: done
  quarantine:
    external: true
    on: {release: validate, discard: done}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.csv", settle: 200ms}}
  app_log: {tail: {path: logs/app.log, match: 'ERROR (?P<code>\\d+)'}}
  nightly: {cron: "0 3 * * *"}
rules:
  - when: inbox
    start: csv_ingest
    data: {path: "{event.path}"}
  - when: app_log
    match: {code: "^5\\\\d\\\\d$"}
    pause: {flow: csv_ingest}
  - when: nightly
    send: {event: release, flow: csv_ingest, state: quarantine}
"""

MINIMAL = "initial: a\nstates:\n  a: {terminal: true}\n"


def load(tmp_path: Path, text: str, name: str = "flow.yaml") -> FlowSpec:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return load_flow_text(path.read_text(), path)


def errors(tmp_path: Path, text: str, name: str = "flow.yaml") -> list[str]:
    """``["line:col: message", ...]`` of a file that must fail to load."""
    with pytest.raises(FlowErrors) as info:
        load(tmp_path, text, name)
    out = []
    for e in info.value.errors:
        assert isinstance(e, FlowError)
        assert e.file == str(tmp_path / name)
        out.append(f"{e.line}:{e.col}: {e.message}")
    return out


# ------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30),
        ("5m", 300),
        ("4h", 14400),
        ("2d", 172800),
        (12, 12.0),
        (0.5, 0.5),
        ("1h30m", 5400),
        ("1.5s", 1.5),
        (" 10s ", 10),
        ("30", 30),
        (0, 0.0),
    ],
)
def test_parse_duration(value, seconds) -> None:
    assert parse_duration(value) == pytest.approx(seconds)
    assert isinstance(parse_duration(value), float)


@pytest.mark.parametrize(
    "value",
    ["-5s", -1, "", "5x", "s", "5 minutes", True, None, [1], float("nan"), float("inf"), "1e3s"],
)
def test_parse_duration_rejects(value) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_negative_message_is_clear() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        parse_duration("-5s")


def test_format_duration() -> None:
    assert format_duration(0.25) == "250ms"
    assert format_duration(90) == "1m30s"
    assert format_duration(14400) == "4h"


# ------------------------------------------------------------------ the example


def test_example_loads_with_all_values(tmp_path: Path) -> None:
    spec = load(tmp_path, EXAMPLE, "csv_ingest.yaml")
    assert spec.flow == "csv_ingest" and spec.name == "csv_ingest"
    assert spec.initial == "validate"
    assert spec.data == {"min_rows": 1}
    d = spec.defaults
    assert (d.try_interval, d.timeout, d.keepalive, d.max_restarts) == (30, 300, None, 5)
    assert (d.error_budget.max_errors, d.error_budget.window) == (8, 14400)
    assert (d.backoff.initial, d.backoff.factor, d.backoff.max, d.backoff.jitter) == (
        10,
        2,
        600,
        "full",
    )
    v = spec.states["validate"]
    assert v.exec_ == ["python", "-m", "examples.validate_csv", "{data.path}"]
    assert v.next_ == "summarise"
    s = spec.states["summarise"]
    assert s.call == "examples.tasks:summarise" and s.to == ["archive", "quarantine"]
    assert s.keepalive == 20 and "keepalive" in s.model_fields_set
    q = spec.states["quarantine"]
    assert q.external and q.on_ == {"release": "validate", "discard": "done"}
    assert spec.states["done"].terminal
    assert spec.sensors["inbox"].kind == "files"
    assert spec.sensors["inbox"].files.settle == pytest.approx(0.2)
    assert spec.sensors["inbox"].files.glob == "*.csv"
    assert spec.sensors["app_log"].tail.match == r"ERROR (?P<code>\d+)"
    assert spec.sensors["nightly"].cron == "0 3 * * *"
    r0, r1, r2 = spec.rules
    assert (r0.action, r0.start, r0.data) == ("start", "csv_ingest", {"path": "{event.path}"})
    assert (r1.action, r1.match, r1.pause.flow) == ("pause", {"code": r"^5\d\d$"}, "csv_ingest")
    assert (r2.action, r2.send.event, r2.send.state) == ("send", "release", "quarantine")
    # positions are kept (1-based)
    assert spec.position(("states", "summarise", "to", 1)) == (19, 19)
    assert spec.position(("states", "quarantine"), key=True) == (24, 3)
    assert spec.position(("rules", 2, "send", "event")) == (40, 19)


def test_defaults_when_omitted(tmp_path: Path) -> None:
    spec = load(tmp_path, MINIMAL, "my_flow.yaml")
    assert spec.flow == "my_flow"  # from the file stem
    d = spec.defaults
    assert (d.try_interval, d.timeout, d.keepalive, d.max_restarts) == (30, 300, None, 5)
    assert d.error_budget.on_exhausted == "failed"
    assert spec.sensors == {} and spec.rules == [] and spec.data == {}


def test_state_overrides_and_explicit_null(tmp_path: Path) -> None:
    spec = load(
        tmp_path,
        """\
        initial: a
        states:
          a: {exec: [sleep, 5, 1.5], next: b, timeout: null, try_interval: 250ms, to: b}
          b: {terminal: true}
        """,
    )
    a: StateSpec = spec.states["a"]
    assert a.exec_ == ["sleep", "5", "1.5"]  # numbers become argv strings
    assert a.to == ["b"]  # a single name is a list of one
    assert a.timeout is None and "timeout" in a.model_fields_set
    assert a.try_interval == 0.25
    assert "keepalive" not in a.model_fields_set


# ------------------------------------------------------------------ errors, with positions


def test_yaml_syntax_error(tmp_path: Path) -> None:
    assert errors(tmp_path, "initial: a\nstates: [a, b\n") == [
        "3:1: YAML syntax error: expected ',' or ']', but got '<stream end>'"
    ]


def test_bad_indentation_is_a_syntax_error(tmp_path: Path) -> None:
    out = errors(tmp_path, "initial: a\nstates:\n  a: 1\n b: 2\n")
    assert len(out) == 1 and out[0].startswith("4:2: YAML syntax error")


def test_duplicate_keys_each_reported(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {terminal: true}
          a: {terminal: true}
        initial: b
        """
    assert errors(tmp_path, text) == [
        "4:3: duplicate key 'a' (first defined at line 3)",
        "5:1: duplicate key 'initial' (first defined at line 1)",
    ]


def test_yaml_tags_are_rejected(tmp_path: Path) -> None:
    text = """\
        initial: a
        data: {x: !!python/object/apply:os.system ["touch pwned"], y: !!str 3}
        states:
          a: !custom {terminal: true}
        """
    assert errors(tmp_path, text) == [
        "2:11: YAML tag !!python/object/apply:os.system is not allowed "
        "(flow files are plain data: no tags)",
        "2:63: YAML tag !!str is not allowed (flow files are plain data: no tags)",
        "4:6: YAML tag !custom is not allowed (flow files are plain data: no tags)",
    ]
    assert not (tmp_path / "pwned").exists()


def test_unknown_key_says_what_was_expected(tmp_path: Path) -> None:
    text = """\
        initial: a
        defaults:
          tmeout: 5m
        states:
          a: {terminal: true, colour: red}
        """
    assert errors(tmp_path, text) == [
        "3:3: unknown key 'tmeout' (did you mean 'timeout'?) (expected one of: try_interval, "
        "timeout, keepalive, error_budget, backoff, max_restarts, log_max, env, secrets, "
        "env_inherit, runs_on, routing_timeout)",
        "5:23: unknown key 'colour' (expected one of: exec, call, next, to, external, on, "
        "terminal, description, try_interval, timeout, keepalive, error_budget, backoff, "
        "max_restarts, log_max, env, secrets, env_inherit, working_dir, limits, user, group, "
        "pool, slots, rate, priority, runs_on, routing_timeout, deadline)",
    ]


def test_unknown_top_level_key(tmp_path: Path) -> None:
    out = errors(tmp_path, MINIMAL + "sensor: {}\n")
    assert out == [
        "4:1: unknown key 'sensor' (did you mean 'sensors'?) (expected one of: flow, "
        "description, label, initial, data, defaults, states, sensors, rules, pools, on_failure, "
        "priority, max_running, on_limit, deadline, retention)"
    ]


def test_missing_required_keys(tmp_path: Path) -> None:
    assert errors(tmp_path, "description: nothing\n") == [
        "1:1: missing required key 'initial'",
        "1:1: missing required key 'states'",
    ]


def test_bad_durations_and_types(tmp_path: Path) -> None:
    text = """\
        initial: a
        defaults:
          try_interval: 5x
          backoff: {factor: 0.5, jitter: half}
          max_restarts: -1
        states:
          a: {terminal: true, keepalive: -3s}
        """
    assert errors(tmp_path, text) == [
        "3:17: defaults.try_interval: invalid duration '5x': expected a duration such as "
        "250ms, 30s, 5m, 4h, 2d (or a number of seconds)",
        "4:21: defaults.backoff.factor: Input should be greater than or equal to 1",
        "4:34: defaults.backoff.jitter: Input should be 'full', 'equal' or 'none'",
        "5:17: defaults.max_restarts: Input should be greater than or equal to 0",
        "7:34: states.a.keepalive: invalid duration '-3s': durations cannot be negative",
    ]


def test_exec_must_be_a_non_empty_argv_with_data_or_event_placeholders(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {exec: "rm -rf {data.path}", next: b}
          b: {exec: [], next: c}
          c: {exec: [cat, "{env.HOME}", "{data.x[0]}"], next: d}
          d: {terminal: true}
        """
    out = errors(tmp_path, text)
    assert out[0].startswith("3:13: states.a.exec: exec takes an argv list")
    assert out[1] == (
        "4:7: states.b.exec: exec needs at least the program name, e.g. [python, script.py]"
    )
    assert out[2] == (
        "5:19: states.c.exec.1: placeholder {env.HOME} is not allowed "
        "(expected {data.…} or {event.…})"
    )
    assert out[3].startswith("5:33: states.c.exec.2: invalid placeholder {data.x[0]}")
    assert len(out) == 4


def test_bad_names(tmp_path: Path) -> None:
    text = """\
        flow: CSV-Ingest
        initial: a
        states:
          a: {terminal: true}
          bad-name: {terminal: true}
        sensors:
          Inbox: {every: 5s}
        """
    assert errors(tmp_path, text) == [
        "1:7: flow: 'CSV-Ingest' does not match ^[a-z_][a-z0-9_]*$",
        "5:3: invalid name 'bad-name': expected letters, digits and _ (no leading digit)",
        "7:3: invalid name 'Inbox': expected [a-z_][a-z0-9_]*",
    ]


def test_flow_name_from_a_bad_file_name(tmp_path: Path) -> None:
    assert errors(tmp_path, MINIMAL, "csv-ingest.yaml") == [
        "1:1: the flow name defaults to the file name 'csv-ingest', which is not a valid flow "
        "name ([a-z_][a-z0-9_]*): rename the file or set flow:"
    ]
    assert load(tmp_path, "flow: ok\n" + MINIMAL, "csv-ingest.yaml").name == "ok"


def test_sensor_errors(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {terminal: true}
        sensors:
          both: {files: {path: x}, every: 5s}
          none: {}
          cron: {cron: "61 * * * *"}
          tail: {tail: {path: log, match: "ERROR (?P<code"}}
          files: {files: {glob: "*.csv", settle: soon}}
        """
    assert errors(tmp_path, text) == [
        "5:3: sensors.both: a sensor needs exactly one of files, tail, every, cron, lifecycle, "
        "webhook (got: files, every)",
        "6:3: sensors.none: a sensor needs exactly one of files, tail, every, cron, lifecycle, "
        "webhook (got: none)",
        "7:16: sensors.cron.cron: invalid cron expression '61 * * * *' (expected e.g. '0 3 * * *')",
        "8:35: sensors.tail.tail.match: invalid regex 'ERROR (?P<code': missing >, "
        "unterminated name at position 10",
        "9:11: missing required key 'path' in sensors.files.files",
        "9:42: sensors.files.files.settle: invalid duration 'soon': expected a duration such "
        "as 250ms, 30s, 5m, 4h, 2d (or a number of seconds)",
    ]


def test_rule_errors(tmp_path: Path) -> None:
    text = """\
        initial: a
        states:
          a: {terminal: true}
        sensors:
          s: {every: 1m}
        rules:
          - when: s
            start: other
            kill: {}
          - when: s
          - when: s
            match: {code: "[5"}
            send: {event: go, data: {path: "(x"}}
          - when: s
            start: x
            data: {p: "{data.path}"}
          - when: s
            pause: {flow: x}
            data: {p: "{event.path}"}
        """
    assert errors(tmp_path, text) == [
        "7:5: rules.0: a rule needs exactly one of start, send, pause, resume, kill, exec, "
        "webhook (got: start, kill)",
        "10:5: rules.1: a rule needs exactly one of start, send, pause, resume, kill, exec, "
        "webhook (got: none)",
        "12:19: rules.2.match.code: invalid regex '[5': unterminated character set at position 0",
        "13:36: rules.2.send.data.path: invalid regex '(x': missing ), unterminated subpattern "
        "at position 0",
        "16:15: rules.3.data.p: placeholder {data.path} is not allowed here (expected {event.…})",
        "17:5: rules.4: data: applies to start: only",
    ]


def test_bare_selector_means_empty(tmp_path: Path) -> None:
    spec = load(tmp_path, MINIMAL + "sensors: {s: {every: 1}}\nrules:\n  - {when: s, pause: }\n")
    assert spec.rules[0].action == "pause" and spec.rules[0].pause.flow is None


def test_not_a_mapping_and_empty(tmp_path: Path) -> None:
    assert errors(tmp_path, "") == [
        "1:1: empty flow file (expected a mapping with initial: and states:)"
    ]
    assert errors(tmp_path, "- a\n- b\n") == [
        "1:1: a flow file must be a mapping (keys initial:, states:, ...)"
    ]


def test_non_string_keys(tmp_path: Path) -> None:
    assert errors(tmp_path, "initial: a\nstates:\n  a: {terminal: true}\ndata: {1: x}\n") == [
        "4:8: keys must be strings, got 1"
    ]


def test_all_errors_are_collected(tmp_path: Path) -> None:
    text = """\
        initial: a
        bogus: 1
        defaults: {timeout: forever}
        states:
          a: {terminal: true}
          a: {terminal: false}
        sensors:
          c: {cron: "nope"}
        """
    out = errors(tmp_path, text)
    assert [o.split(":")[0] for o in out] == ["2", "3", "6", "8"]
