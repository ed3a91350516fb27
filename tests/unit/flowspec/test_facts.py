"""The flow facts the read side keeps on disk (``runner.flowspec.facts``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import IllegalMove, UserError
from runner.flowspec import facts
from runner.flowspec.compiler import compile_source

ROOT = Path(__file__).resolve().parents[3]

FLOW = """\
flow: gate
initial: work
defaults:
  try_interval: 7s
  error_budget: {max_errors: 4, window: 1h}
states:
  work:
    exec: [/bin/true]
    env: {MODE: fast}
    backoff: {initial: 2s, factor: 3, max: 1m, jitter: equal}
    next: wait
  wait:
    external: true
    on: {release: done, discard: gone}
  done: {terminal: true}
  gone: {terminal: true}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(facts, "_memo", {})
    return tmp_path / "cache" / "flowrun" / "facts"


def test_the_facts_are_the_compiled_flows():
    flow = compile_source(FLOW, "gate.yaml")
    got = facts.facts_from_json(facts.facts_json(flow))
    assert (got.name, got.version, got.initial) == (flow.name, flow.version, flow.initial)
    assert list(got.states) == list(flow.states)
    for name, st in flow.states.items():
        f = got.states[name]
        assert (f.kind, f.next, f.to, f.on, f.policy) == (st.kind, st.next, st.to, st.on, st.policy)
        assert f.setup.env_names == st.setup.env_names
        assert f.setup.secret_names == st.setup.secret_names
    assert got.event_target("wait", "release") == flow.event_target("wait", "release") == "done"
    for state, event in (("wait", "nope"), ("work", "release"), ("missing", "release")):
        with pytest.raises(IllegalMove):
            got.event_target(state, event)


def test_a_miss_compiles_once_then_the_file_answers(cache, monkeypatch):
    flow = compile_source(FLOW, "gate.yaml")
    calls = []

    def compile_flow():
        calls.append(1)
        return flow

    first = facts.cached_facts(flow.version, compile_flow)
    assert len(calls) == 1 and len(list(cache.glob("*.json"))) == 1
    monkeypatch.setattr(facts, "_memo", {})  # a new process: only the file is left

    def must_not_compile():
        raise AssertionError("compiled on a hit")

    assert facts.cached_facts(flow.version, must_not_compile) == first


def test_a_damaged_or_foreign_file_is_compiled_again(cache, monkeypatch):
    flow = compile_source(FLOW, "gate.yaml")
    facts.cached_facts(flow.version, lambda: flow)
    (path,) = cache.glob("*.json")
    for text in ("{not json", '{"format": 0}', "[]"):
        path.write_text(text)
        monkeypatch.setattr(facts, "_memo", {})
        assert facts.cached_facts(flow.version, lambda: flow).states["wait"].on == {
            "release": "done",
            "discard": "gone",
        }


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file: no folder can be made in it
    monkeypatch.setattr(facts, "_memo", {})
    flow = compile_source(FLOW, "gate.yaml")
    assert facts.cached_facts(flow.version, lambda: flow).initial == "work"


def test_a_compile_error_is_not_cached(cache):
    def broken():
        raise UserError("stored flow version x no longer compiles: y", 2)

    with pytest.raises(UserError):
        facts.cached_facts("0123456789abcdef", broken)
    assert not cache.exists() or not list(cache.glob("*.json"))


def test_readers_compile_without_importing_call_modules(tmp_path):
    source = FLOW.replace("exec: [/bin/true]", 'call: "no_such_module_here:run"')
    with pytest.raises(Exception, match="cannot import module"):
        compile_source(source, tmp_path / "gate.yaml")
    flow = compile_source(source, tmp_path / "gate.yaml", imports=False)
    assert flow.states["work"].kind == "call" and flow.states["work"].func is None
