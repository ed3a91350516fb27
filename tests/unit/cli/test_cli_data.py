"""Command-line instance data within bounds (``runner.cli.data``): whatever the
CLI cannot accept is one line and exit 2, never a ``RecursionError`` traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli.data import MAX_DATA_BYTES, MAX_DATA_DEPTH, parse_data, too_deep
from runner.cli.main import main
from runner.errors import UserError

DEEP = "[" * 10_000 + "]" * 10_000


def nest(depth: int) -> str:
    return "[" * depth + "]" * depth


def refused(data_json: str | None, *pairs: str) -> str:
    with pytest.raises(UserError) as info:
        parse_data(data_json, pairs)
    assert info.value.exit_code == 2
    return str(info.value)


def test_pairs_and_data_merge() -> None:
    data = parse_data('{"a": 1, "b": [1, {"c": "x"}]}', ("a=2", "s=plain", 'j={"k": null}'))
    assert data == {"a": 2, "b": [1, {"c": "x"}], "s": "plain", "j": {"k": None}}


def test_depth_bound_is_exact() -> None:
    inner = nest(MAX_DATA_DEPTH - 1)  # inside the --data object: one level already
    assert parse_data('{"v": ' + inner + "}", ()) == {"v": json.loads(inner)}
    assert "nested too deep at character" in refused('{"v": ' + nest(MAX_DATA_DEPTH) + "}")
    assert parse_data(None, (f"v={nest(MAX_DATA_DEPTH)}",))["v"] == json.loads(nest(MAX_DATA_DEPTH))
    assert "data 'v': nested too deep" in refused(None, f"v={DEEP}")
    # brackets inside strings do not count
    assert too_deep('{"s": "' + "[" * 200 + '"}') is None


@pytest.mark.parametrize(
    "data_json, says",
    [
        ('{"v": NaN}', "NaN is not allowed"),
        ('{"v": -Infinity}', "-Infinity is not allowed"),
        ('{"v": 1e999}', "1e999 is out of range"),
        ('{"v": ' + "9" * 5000 + "}", "number too long"),
        ('{"v": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_not_strict_json(data_json: str, says: str) -> None:
    assert says in refused(data_json)


def test_pair_values_that_are_not_json_stay_strings() -> None:
    data = parse_data(None, ("a=NaN", "b=1e999", "c=" + "9" * 5000, "d=[1"))
    assert data == {"a": "NaN", "b": "1e999", "c": "9" * 5000, "d": "[1"}


def test_size_bound() -> None:
    big = '{"v": "' + "x" * MAX_DATA_BYTES + '"}'
    assert "data too large" in refused(big)
    assert "data too large" in refused(
        None, "a=" + "x" * (MAX_DATA_BYTES // 2), "b=" + "y" * (MAX_DATA_BYTES // 2)
    )


def test_main_answers_one_line(tmp_path: Path, capsys) -> None:
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "good.yaml").write_text("initial: a\nstates:\n  a: {terminal: true}\n")
    base = ["--flows", str(flows), "--db", f"sqlite:///{tmp_path / 'f.db'}", "start", "good"]
    for extra in (["--data", '{"v": ' + DEEP + "}"], [f"v={DEEP}"], ["--data", "{nope"]):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("flowrun: "), err
    assert main([*base, "v=[1]"]) == 0
