"""What the docs show handler and flow authors works: every ``runner.…`` name the docs
mention imports, every code block marked ``example`` runs, and citations of the
performance reference name a heading it has.

A block is an example when its fence says so: ```` ```python example ```` or
```` ```yaml example ```` (in ``docs/handlers.md`` and ``docs/flows.md``). A YAML example
goes through flowrun's own loader and checks (``compile_source``), completed into a flow
when it is a fragment: a map of states is put under ``states``, a state it names but
does not define becomes a terminal state. A Python example is executed in a clean
interpreter outside the test process with a real control channel (a pipe named by
``FLOWRUN_CONTROL_FD``): every line it writes must be a well-formed control line, and
each function it defines whose first parameter is a ``Context`` is called with a real
one and must return what a ``call`` handler may return.

Code that cites ``docs/performance.md`` names one of its headings, and that heading exists.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from runner.control_channel import parse
from runner.flowspec.compiler import compile_source
from tests.support.handler_run import run_with_control

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "flows" / "README.md"]
EXAMPLE_PAGES = [ROOT / "docs" / "handlers.md", ROOT / "docs" / "flows.md"]

#: A dotted ``runner`` name in running text (not a path such as ``stator/runner.py``).
NAME = re.compile(r"(?<![\w./-])runner(?:\.[A-Za-z_]\w*)+")
#: A fenced block: its info string and its text.
FENCE = re.compile(r"^```(\w+)([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
#: Optional parts: a name here may be missing where its optional part is (no compiler).
OPTIONAL = {"runner.handlers._spawn"}


def mentioned_names() -> list[tuple[str, str]]:
    """``(name, page)`` for every ``runner.…`` name the docs mention, once each."""
    seen: dict[str, str] = {}
    for page in DOCS:
        for name in NAME.findall(page.read_text(encoding="utf-8")):
            seen.setdefault(name.rstrip("."), page.relative_to(ROOT).as_posix())
    return sorted(seen.items())


def resolve(name: str) -> object:
    """The module or attribute a dotted name means: the longest importable module
    prefix, then attributes. Raises ``ImportError`` or ``AttributeError``."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            tried = ".".join(parts[:cut])
            if not exc.name or not (tried + ".").startswith(exc.name + "."):
                raise  # the module exists but fails to import: a real failure
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def examples(lang: str) -> list[tuple[str, str]]:
    """``(page:line, text)`` of every block of ``lang`` marked ``example``."""
    found = []
    for page in EXAMPLE_PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) == lang and "example" in m.group(2).split():
                line = text.count("\n", 0, m.start()) + 1
                found.append((f"{page.relative_to(ROOT).as_posix()}:{line}", m.group(3)))
    return found


@pytest.mark.parametrize(("name", "page"), mentioned_names())
def test_every_runner_name_the_docs_mention_imports(name: str, page: str) -> None:
    try:
        resolve(name)
    except (ImportError, AttributeError) as exc:
        if name in OPTIONAL and isinstance(exc, ModuleNotFoundError):
            pytest.skip(f"{name}: optional part not built")
        pytest.fail(f"{page} mentions {name}, which does not import: {exc}")


def test_the_name_scan_sees_names_and_the_resolver_fails_on_a_wrong_one() -> None:
    names = dict(mentioned_names())
    assert "runner.control" in names and "runner.control.LeaseLost" in names
    assert not any(n.endswith(".py") for n in names)  # paths are not names
    with pytest.raises(AttributeError):
        resolve("runner.handlers.LeaseLost")  # what docs/handlers.md once said
    with pytest.raises((ImportError, AttributeError)):
        resolve("runner.no_such_module")


def complete_flow(doc: dict) -> dict:
    """A fragment of a flow file completed into a whole flow (see the module docstring)."""
    handler_keys = {"exec", "call", "external", "terminal"}
    if "states" not in doc and all(
        isinstance(v, dict) and handler_keys & set(v) for v in doc.values()
    ):
        doc = {"states": doc}
    doc = dict(doc)
    states = dict(doc.get("states") or {})
    named = []
    for st in states.values():
        named += [st.get("next"), *st.get("to", []), *(st.get("on") or {}).values()]
    for target in named:
        if isinstance(target, str) and target not in states:
            states[target] = {"terminal": True}
    if not states:
        states = {"start": {"exec": ["true"], "next": "done"}, "done": {"terminal": True}}
    doc["states"] = states
    doc.setdefault("initial", next(iter(states)))
    return doc


@pytest.mark.parametrize(("where", "text"), examples("yaml"), ids=lambda v: v[:30])
def test_yaml_examples_load_and_check(where: str, text: str) -> None:
    doc = YAML(typ="safe", pure=True).load(text)
    assert isinstance(doc, dict), f"{where}: not a map"
    flow = complete_flow(doc)
    # JSON is YAML: the loader and every check of `flowrun check` run on it
    compiled = compile_source(json.dumps(flow), ROOT / "flows" / "doc_example.yaml")
    assert set(compiled.states) == set(flow["states"]), where


HARNESS = r"""
import asyncio, inspect, json, sys
from runner.control import Context, Sleep
where, code = sys.argv[1], sys.stdin.read()
ns = {"__name__": "doc_example"}
exec(compile(code, where, "exec"), ns)
returned = {}
for name, fn in list(ns.items()):
    if not inspect.isfunction(fn) or fn.__module__ != "doc_example":
        continue
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].annotation not in (Context, "Context"):
        continue
    ctx = Context(data={}, instance_id=1, flow="doc", state="s", attempt=1)
    value = fn(ctx)
    if inspect.iscoroutine(value):
        value = asyncio.run(value)
    ok = value is None or value is True or isinstance(value, str | Sleep)
    returned[name] = [ok, repr(value)]
print(json.dumps(returned))
"""


def run_python_example(where: str, text: str) -> tuple[dict, list[str]]:
    """Run ``text`` as an ``exec`` handler would run it (the flows folder as working
    directory, a control pipe): what its ``call`` functions returned, and its control
    lines."""
    env = {"PYTHONPATH": str(ROOT), "FLOWRUN_DATA": "{}"}
    argv = [sys.executable, "-c", HARNESS, where]
    proc, lines = run_with_control(argv, ROOT / "flows", env, stdin=text)
    assert proc.returncode == 0, f"{where}:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), lines


@pytest.mark.parametrize(("where", "text"), examples("python"), ids=lambda v: v[:30])
def test_python_examples_run(where: str, text: str) -> None:
    returned, lines = run_python_example(where, text)
    for line in lines:
        parse(line)  # raises ValueError for a malformed control line
    for name, (ok, value) in returned.items():
        assert ok, f"{where}: {name} returned {value}, which a call handler may not"


def test_the_example_runner_sees_lines_returns_and_failures() -> None:
    code = (
        "from runner.control import Context, checkpoint, goto\n"
        "checkpoint({'a': 1}); goto('next_one')\n"
        "def handler(ctx: Context):\n    return 42\n"
    )
    returned, lines = run_python_example("probe", code)
    assert lines == ['checkpoint {"a":1}', "goto next_one"]
    assert returned == {"handler": [False, "42"]}
    with pytest.raises(AssertionError, match="NameError"):
        run_python_example("probe", "undefined_name\n")
    with pytest.raises(Exception, match="unknown_key"):
        compile_source(
            json.dumps(complete_flow({"s": {"exec": ["true"], "unknown_key": 1}})),
            ROOT / "flows" / "x.yaml",
        )
    assert len(examples("yaml")) >= 6 and len(examples("python")) >= 3


#: ``docs/performance.md``, "Heading": how code and docs cite the performance reference.
CITE = re.compile(r'performance\.md`*,\s*"([^"]+)"')


def citations(text: str) -> list[str | None]:
    """Each citation of ``performance.md`` in ``text``: the heading it names, or ``None``.
    Comment markers and line breaks between the name and the heading are ignored."""
    flat = re.sub(r"\s*\n\s*(?:\*(?!\*)|#:?)?\s*", " ", text)
    found = []
    for m in re.finditer(r"performance\.md", flat):
        cite = CITE.match(flat, m.start())
        found.append(cite.group(1) if cite else None)
    return found


def test_code_cites_performance_by_an_existing_heading() -> None:
    perf = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^#{2,3} (.+)$", perf, re.M))
    sources = [*(ROOT / "runner").rglob("*.py"), *(ROOT / "runner").rglob("*.c")]
    sources.append(ROOT / "docs" / "architecture.md")
    cited = 0
    for path in sources:
        for heading in citations(path.read_text(encoding="utf-8")):
            where = path.relative_to(ROOT)
            assert heading is not None, f"{where} cites docs/performance.md without a heading"
            assert heading in headings, f"{where} cites a heading that is gone: {heading!r}"
            cited += 1
    assert cited >= 10
    assert citations('see (``docs/performance.md``,\n    # "Two cycles in flight")') == [
        "Two cycles in flight"
    ]
    assert citations("docs/performance.md, issue 13, fifth pass") == [None]
