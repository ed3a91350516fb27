"""A flow file with field errors is still checked without its broken parts: every
independent mistake is reported in one run, at its own position, and leaving a part out
invents no mistake (``runner.flowspec.partial``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runner.errors import FlowErrors
from runner.flowspec.compiler import compile_source
from runner.flowspec.registry import FlowRegistry


def errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "f.yaml"
    with pytest.raises(FlowErrors) as info:
        compile_source(textwrap.dedent(text), path)
    return [str(e).removeprefix(f"{path}:") for e in info.value.errors]


def test_a_state_left_out_whole_is_not_reported_as_unknown(tmp_path: Path) -> None:
    got = errors(
        tmp_path,
        """\
        initial: a
        states:
          a: {exec: [x], to: [b, c]}
          b: 5
          c: {exec: [x], next: done}
          done: {terminal: true}
        """,
    )
    assert len(got) == 1 and got[0].startswith("4:6: states.b: "), got


def test_a_bad_next_invents_no_dead_end_and_no_unreachable_state(tmp_path: Path) -> None:
    got = errors(
        tmp_path,
        """\
        initial: a
        states:
          a: {exec: [x], next: [done]}
          done: {terminal: true}
        """,
    )
    assert got == ["3:18: states.a.next: Input should be a valid string"]


def test_rules_after_a_rule_left_out_keep_their_positions(tmp_path: Path) -> None:
    got = errors(
        tmp_path,
        """\
        initial: a
        states:
          a: {external: true, on: {go: done}}
          done: {terminal: true}
        sensors:
          inbox: {files: {path: in}}
          broken: {files: {glob: 5}}
        rules:
          - {start: f}
          - {when: inbx, send: {event: go}}
          - {when: broken, send: {event: og}}
        """,
    )
    assert got == [
        "7:12: missing required key 'path' in sensors.broken.files",
        "7:26: sensors.broken.files.glob: Input should be a valid string",
        "9:5: missing required key 'when' in rules.0",
        # the rule after the one left out, at its own line
        "10:12: rule names unknown sensor 'inbx' (did you mean 'inbox'?) (sensors of this "
        "flow: inbox)",
        # the rule naming the sensor left out is not told its sensor is unknown, but its
        # event is still checked
        "11:34: no state accepts event 'og' (events: go)",
    ]


def test_a_left_out_pool_declaration_invents_no_unknown_pool(tmp_path: Path) -> None:
    """The folder's cross-flow checks run on what of a broken file validated: a rule
    naming no flow is reported with the field error, a state naming a pool whose
    declaration was left out is not."""
    (tmp_path / "f.yaml").write_text(
        textwrap.dedent(
            """\
            pools: {db: lots}
            initial: a
            states:
              a: {exec: [x], next: done, pool: db}
              done: {terminal: true}
            sensors:
              clk: {every: 1h}
            rules:
              - {when: clk, start: nowhere}
            """
        )
    )
    prefix = f"{tmp_path / 'f.yaml'}:"
    got = [str(e).removeprefix(prefix) for e in FlowRegistry(tmp_path).load_all()]
    assert len(got) == 2, got
    assert got[0].startswith("1:13: pools.db: ")
    assert got[1].startswith("9:24: unknown flow 'nowhere'")
