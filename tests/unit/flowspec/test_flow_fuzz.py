"""Mutated flow files never break ``flowrun check``: a property-based test.

Valid flows are mutated (keys deleted and renamed, values of the wrong type, huge
numbers, NaN/inf durations, deep nesting, aliases and anchors, truncation at random
offsets, random bytes). For every mutant, ``flowrun check`` either passes or exits 2
with at least one ``file:line:col:`` inside the file, and never prints a traceback;
mutations that keep a flow valid (comments, data values, aliases inside ``data:``) pass.

Most examples run in-process through ``runner.cli.main.main`` (what the ``flowrun``
script runs); a few through real ``flowrun check`` subprocesses. The hypothesis settings
are fixed (derandomized, no deadline) so the run is the same every time.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from runner.cli.main import main
from tests.support.fault import flowrun_cmd

MINIMAL = "initial: a\nstates:\n  a: {terminal: true}\n"
RICH = """\
flow: rich
description: most of the keys a flow has
initial: fetch
data: {url: "http://example.com", retries: 3, nested: {a: [1, 2, {b: c}]}}
defaults:
  try_interval: 10s
  timeout: 2m
  error_budget: {max_errors: 3, window: 1h, on_exhausted: failed}
  backoff: {initial: 5s, factor: 2, max: 5m, jitter: full}
  max_restarts: 3
states:
  fetch:
    exec: [python, -c, "pass", "{data.url}"]
    next: check
    to: [parked]
    timeout: 30s
  check:
    exec: [sh, -c, "exit 0"]
    next: done
  parked:
    external: true
    on: {release: fetch, drop: done}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.csv", settle: 200ms}}
rules:
  - when: inbox
    start: rich
    data: {path: "{event.path}"}
"""
BASES = [MINIMAL, RICH]

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


def _load(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


def _dump(doc: Any) -> str:
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.dump(doc, out)
    return out.getvalue()


def _paths(node: Any, here: tuple = ()) -> list[tuple]:
    """Every key/index path in ``node`` (mappings and lists), outermost first."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*here, k))
            out += _paths(v, (*here, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*here, i))
            out += _paths(v, (*here, i))
    return out


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["nan s", "inf", "-5s", "1e400s", "99999999999999999999d", "0s", "5 m"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
    st.integers(min_value=1, max_value=120).map(_nest),
)


@st.composite
def structural(draw) -> str:
    """A base flow with one key deleted, renamed, or given a wrong value."""
    doc = _load(draw(st.sampled_from(BASES)))
    paths = _paths(doc)
    path = draw(st.sampled_from(paths))
    parent = doc
    for seg in path[:-1]:
        parent = parent[seg]
    last = path[-1]
    op = draw(st.sampled_from(["delete", "rename", "wrong"]))
    if op == "delete":
        del parent[last]
    elif op == "rename" and isinstance(parent, dict):
        new = draw(st.one_of(st.text(max_size=10), st.just(str(last) + "s"), st.integers()))
        parent[new] = parent.pop(last)
    else:
        parent[last] = draw(WRONG)
    return _dump(doc)


SNIPPETS = [
    "x: &a [*a]\n",
    "data: {x: &b {y: *b}}\n",
    "  - *nope\n",
    "<<: *nope\n",
    "a: &c [1, 2]\nb: [*c, *c, *c]\n",
    "[" * 100,
    "{a: " * 70,
    "- " * 80 + "x\n",
    "\t",
    "---\n",
    "? [a]\n: b\n",
    "!!python/object:os.system x\n",
    "timeout: .nan\n",
    "timeout: " + "9" * 200 + "\n",
    "%YAML 1.1\n",
    "'unclosed\n",
]


@st.composite
def textual(draw) -> bytes:
    """A base (or a structural mutant) cut, patched with bytes, or given a YAML snippet."""
    text = draw(st.one_of(st.sampled_from(BASES), structural()))
    data = text.encode()
    at = draw(st.integers(min_value=0, max_value=len(data)))
    op = draw(st.sampled_from(["truncate", "bytes", "overwrite", "snippet"]))
    if op == "truncate":
        return data[:at]
    if op == "bytes":
        return data[:at] + draw(st.binary(min_size=1, max_size=6)) + data[at:]
    if op == "overwrite" and at < len(data):
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    line_start = data.rfind(b"\n", 0, at) + 1
    return data[:line_start] + draw(st.sampled_from(SNIPPETS)).encode() + data[line_start:]


@st.composite
def valid(draw) -> str:
    """Mutations that keep a flow valid: comments, data values, aliases inside data."""
    doc = _load(draw(st.sampled_from(BASES)))
    # text a flow file may hold: no control characters (C0 but tab/newline, C1), no
    # surrogates or non-characters, no Unicode line/paragraph separators
    printable = st.characters(codec="utf-8", exclude_categories=["Cc", "Cs", "Cn", "Zl", "Zp"])
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**15), max_value=10**15),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(alphabet=printable, max_size=20),
    )
    keys = st.text(alphabet=printable, max_size=8)
    values = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)
        ),
        max_leaves=10,
    )
    doc.setdefault("data", {})
    doc["data"].update(draw(st.dictionaries(keys, values, max_size=4)))
    text = _dump(doc)
    if draw(st.booleans()):
        text += "# " + draw(st.text(alphabet=printable, max_size=20)) + "\n"
    if draw(st.booleans()):
        text = text.replace("data:\n", "data:\n  shared_x: &shared [1, 2]\n  use_x: *shared\n", 1)
    return text


_POSITION = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): ")


def check_in_process(path: Path) -> tuple[int, str]:
    """``flowrun check PATH`` through ``main``; returns (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["check", str(path)])
    return code, err.getvalue()


def assert_answer(path: Path, data: bytes, code: int, stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    if code == 0:
        return
    assert code == 2, (code, stderr)
    lines = data.count(b"\n") + 1
    inside = []
    for line in stderr.splitlines():
        m = _POSITION.match(line)
        if m and m["file"] == str(path) and 1 <= int(m["line"]) <= lines and int(m["col"]) >= 1:
            inside.append(line)
    assert inside, (data[:300], stderr)


def write(folder: str, data: bytes) -> Path:
    path = Path(folder) / "mutant.yaml"
    path.write_bytes(data)
    return path


@FUZZ
@given(st.one_of(structural().map(str.encode), textual()))
def test_mutants_answer_cleanly(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write(folder, data)
        assert_answer(path, data, *check_in_process(path))


@settings(FUZZ, max_examples=60)
@given(valid())
def test_valid_mutations_pass(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write(folder, text.encode())
        code, stderr = check_in_process(path)
        assert code == 0, (text, stderr)


@settings(FUZZ, max_examples=3)
@given(textual())
def test_mutants_through_real_flowrun_check(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = write(folder, data)
        proc = subprocess.run(
            [*flowrun_cmd(), "check", str(path)], capture_output=True, text=True, timeout=120
        )
        assert_answer(path, data, proc.returncode, proc.stderr)


def test_bases_are_valid() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for base in BASES:
            path = write(folder, base.encode())
            assert check_in_process(path) == (0, ""), json.dumps(base)
