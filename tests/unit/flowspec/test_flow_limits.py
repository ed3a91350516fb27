"""The flow-file loader's bounds (``runner.flowspec.limits``): every hostile
file is refused with ONE positioned error, through ``load_flow`` (what ``flowrun check``
and the daemon's hot reload use) on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.errors import FlowErrors
from runner.flowspec import limits
from runner.flowspec.compiler import load_flow
from runner.flowspec.loader import load_flow_text
from tests.support.hostile import CASES, GOOD, Hostile


def errors_of(path: Path) -> list[str]:
    with pytest.raises(FlowErrors) as info:
        load_flow(path)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_file_gives_one_positioned_error(tmp_path: Path, case: Hostile) -> None:
    path = tmp_path / f"{case.name}.yaml"
    path.write_bytes(case.data)
    errors = errors_of(path)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"{path}:{case.line}:{case.col}: "), errors
    assert case.says in errors[0]
    assert "\n" not in errors[0]


def body(text: str) -> str:
    return GOOD + text


def one_error(text: str) -> str:
    with pytest.raises(FlowErrors) as info:
        load_flow_text(text, "f.yaml")
    assert len(info.value.errors) == 1, info.value.errors
    return str(info.value.errors[0])


@pytest.mark.parametrize(
    "text, where, says",
    [
        # nesting is refused where it crosses the bound, in every YAML spelling
        ("data:\n  x: " + "{a: " * 100 + "1" + "}" * 100 + "\n", "5:254:", "nested too deep"),
        (
            "data:\n" + "".join(" " * (i + 2) + f"k{i}:\n" for i in range(100)),
            "68:",
            "nested too deep",
        ),
        (
            "data:\n  x:\n" + "".join(" " * (i + 4) + "-\n" for i in range(100)),
            "68:",
            "nested too deep",
        ),
        ("data: {x: " + "9" * 5000 + "}\n", "4:11:", "number too long"),
        ("data: &a {y: [1, *a]}\n", "4:18:", "alias *a refers to the collection"),
        ("description: a\x85b\n", "4:15:", "U+0085"),
        ("description: a\x7fb\n", "4:15:", "U+007F"),
    ],
    ids=["flow-map", "block-map", "block-list", "number", "recursive", "nel", "del"],
)
def test_bounds_in_text(text: str, where: str, says: str) -> None:
    message = one_error(body(text))
    assert message.startswith(f"f.yaml:{where}"), message
    assert says in message


def nested(depth: int) -> str:
    return body("data:\n  x: " + "[" * depth + "]" * depth + "\n")


def test_within_bounds_is_fine() -> None:
    depth = limits.MAX_DEPTH - 2  # the document and data: are two levels
    value = load_flow_text(nested(depth), "f.yaml").data["x"]
    for _ in range(depth - 1):
        (value,) = value
    assert value == []
    assert "nested too deep" in one_error(nested(depth + 1))
    aliases = body("data:\n  a: &a [1, 2]\n  b: [*a, *a, *a]\n")
    assert load_flow_text(aliases, "f.yaml").data["b"] == [[1, 2]] * 3


def test_node_bound_counts_expanded_aliases() -> None:
    per = limits.MAX_NODES // 10 + 1
    text = body(
        "data:\n  a: &a [" + ",".join(["1"] * 10) + "]\n  b: [" + ",".join(["*a"] * per) + "]\n"
    )
    message = one_error(text)
    assert message.startswith("f.yaml:6:") and "aliases expanded" in message


def test_time_bound(monkeypatch) -> None:
    monkeypatch.setattr(limits, "MAX_SECONDS", 0.0)
    errors: list = []
    yaml = limits.guarded_yaml("f.yaml", errors, seconds=0.0)
    with pytest.raises(limits.LimitError) as info:
        yaml.load(GOOD)
    assert "takes longer than" in info.value.message and info.value.line >= 1


def test_tags_and_duplicate_keys_still_collected() -> None:
    with pytest.raises(FlowErrors) as info:
        load_flow_text(body("data: {a: 1, a: 2, b: !!str 3}\n"), "f.yaml")
    messages = [str(e) for e in info.value.errors]
    assert any("duplicate key 'a'" in m and m.startswith("f.yaml:4:14:") for m in messages)
    assert any("YAML tag !!str" in m for m in messages)


def test_unreadable_and_text_too_large(tmp_path: Path) -> None:
    assert errors_of(tmp_path / "missing.yaml")[0].endswith("No such file or directory")
    message = one_error(body("description: " + "x" * limits.MAX_FILE_BYTES + "\n"))
    assert message.startswith("f.yaml:1:1: flow file too large")


def test_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it for reading must not block
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")  # endless bytes
    for path in (fifo, zero):
        assert errors_of(path) == [f"{path}: not a regular file"]
