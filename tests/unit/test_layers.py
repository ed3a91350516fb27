"""The layers of ``runner/`` are checked, not described.

Static (the AST of every ``runner/**.py``): each import of a ``runner`` module respects
the layer order, lazy imports included; the named contracts hold; the imports that run
when a module is imported form no cycle; nothing re-exports (no ``__all__``, no package
``__init__.py`` with imports) but the one public module, ``runner.control``, ranked above
every layer so that no module of ``runner`` imports it. Dynamic (clean interpreters):
importing every module of a layer loads no module of a layer it must not know, and the
light commands (``flowrun --help``, ``check``, ``ls``) load none of the heavy parts they
do not need.

Each check is also run on a synthetic package with one deliberate violation of each
kind, so none can pass by finding nothing.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The ground modules: no I/O, import no runner sub-package (only each other).
GROUND = (
    "errors",
    "error_line",
    "durations",
    "templating",
    "lifecycle",
    "control_channel",
    "retention",
    "literal",
    "log_buffer",
    "labels",
    "warn_line",
)

#: Layer order: a module may import its own layer and the layers ranked below it.
RANK = {
    "ground": 0,
    "flowspec": 1,
    "store": 2,
    "handlers": 3,
    "engine": 4,
    "ops": 4,
    "sensors": 5,
    "tui": 6,
    "service": 7,
    "cli": 8,
    # the handler authors' API (runner/control.py): the one re-export facade, on top so
    # that nothing in runner imports it (its call-side names load lazily: see below)
    "control": 9,
}

#: The one module allowed to re-export (``__all__``): the handler authors' API.
PUBLIC = "runner.control"

#: The named contracts (importer layer, imported layer), refused whatever the ranks say.
FORBIDDEN = {
    ("flowspec", "store"),
    ("handlers", "store"),
    ("engine", "cli"),
    ("engine", "tui"),
    ("engine", "sensors"),
    ("engine", "service"),
    ("tui", "engine"),
    ("tui", "handlers"),
}


@dataclass(frozen=True)
class Import:
    """One import of a ``runner`` module: ``eager`` when it runs as ``importer`` is
    imported (module level, not under ``if TYPE_CHECKING:``, not in a function)."""

    importer: str
    target: str
    path: Path
    line: int
    eager: bool


def layer(module: str) -> str:
    """``runner.store.db`` → ``store``; ``runner.errors`` and ``runner`` → ``ground``."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in GROUND:
        return "ground"
    return parts[1]


def modules_of(root: Path) -> dict[str, Path]:
    """Every module under ``root/runner`` by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((root / "runner").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(root: Path) -> list[Import]:
    """Every import of a ``runner`` module in ``root/runner/**.py``."""
    modules = modules_of(root)
    found: list[Import] = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(node: ast.AST, eager: bool, name=name, path=path, package=package) -> None:
            for child in ast.iter_child_nodes(node):
                child_eager = eager
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    child_eager = False
                if isinstance(child, ast.If) and _is_type_checking(child.test):
                    for sub in child.body:
                        visit(ast.Module(body=[sub], type_ignores=[]), False)
                    for sub in child.orelse:
                        visit(ast.Module(body=[sub], type_ignores=[]), eager)
                    continue
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join([*anchor, base] if base else anchor)
                    for alias in child.names:
                        sub = f"{base}.{alias.name}"
                        targets.append(sub if sub in modules else base)
                for target in targets:
                    if target == "runner" or target.startswith("runner."):
                        found.append(Import(name, target, path, child.lineno, child_eager))
                visit(child, child_eager)

        visit(ast.parse(path.read_text(), str(path)), True)
    return found


def layer_problems(root: Path) -> list[str]:
    """Imports against the layer order or a named contract, and unknown layers."""
    problems = []
    for name in modules_of(root):
        if layer(name) not in RANK:
            problems.append(f"{name}: layer {layer(name)!r} has no rank in RANK")
    for imp in imports_of(root):
        src, dst = layer(imp.importer), layer(imp.target)
        if src == dst or src not in RANK or dst not in RANK:
            continue
        if (src, dst) in FORBIDDEN:
            why = "a named contract forbids it"
        elif RANK[dst] >= RANK[src]:
            why = "not a lower layer"
        else:
            continue
        rel = imp.path.relative_to(root)
        problems.append(
            f"{rel}:{imp.line}: {imp.importer} ({src}) imports {imp.target} ({dst}): {why}"
        )
    return problems


def cycles(root: Path) -> list[list[str]]:
    """Import cycles among the eager imports (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = {name: set() for name in modules_of(root)}
    for imp in imports_of(root):
        if imp.eager and imp.target in graph:
            graph[imp.importer].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def facade_problems(root: Path) -> list[str]:
    """``__all__`` anywhere but in ``PUBLIC``, and package ``__init__.py`` files that
    import anything."""
    problems = []
    for name, path in modules_of(root).items():
        if name == PUBLIC:
            continue
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                problems.append(f"{rel}:{node.lineno}: __all__ (import names from their module)")
            if path.name == "__init__.py" and isinstance(node, ast.Import | ast.ImportFrom):
                problems.append(f"{rel}:{node.lineno}: package {name} imports (a facade)")
    return problems


# --- the real package ---------------------------------------------------------------


def test_every_import_respects_the_layer_order_and_the_contracts():
    assert layer_problems(ROOT) == []


def test_no_import_cycles_between_modules():
    assert cycles(ROOT) == []


def test_nothing_re_exports():
    assert facade_problems(ROOT) == []


def test_the_checks_see_the_real_imports():
    """Guards the scanner itself: known edges of the real package are found."""
    found = {(i.importer, i.target, i.eager) for i in imports_of(ROOT)}
    assert ("runner.engine.worker", "runner.store.heartbeat", True) in found  # from x import mod
    assert ("runner.cli.operator", "runner.ops.queries", False) in found  # in a body
    assert ("runner.cli.context", "runner.engine.config", False) in found  # TYPE_CHECKING
    assert ("runner.handlers.exec_handler", "runner.control_channel", True) in found
    assert ("runner.control", "runner.handlers.attempt", False) in found  # its lazy names


# --- deliberate violations: the checks must fail on them ------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


CLEAN = {
    "runner/__init__.py": '"""Docstring only."""\n',
    "runner/errors.py": "import json\n",
    "runner/flowspec/__init__.py": "",
    "runner/flowspec/spec.py": "from runner.errors import x\n",
    "runner/store/__init__.py": "",
    "runner/store/db.py": "from runner.flowspec import spec\n",
    "runner/engine/__init__.py": "",
    "runner/engine/worker.py": "from typing import TYPE_CHECKING\n"
    "import runner.store.db\n"
    "if TYPE_CHECKING:\n    from runner.engine import cycle\n",
    "runner/engine/cycle.py": "def f():\n    from runner.engine import worker\n",
    "runner/cli/__init__.py": "",
    "runner/cli/main.py": "def f():\n    from runner.engine.worker import Worker\n",
}


def test_a_clean_synthetic_package_passes(tmp_path):
    root = _package(tmp_path, CLEAN)
    assert layer_problems(root) == []
    assert cycles(root) == []  # the cycle goes through TYPE_CHECKING and a function body
    assert facade_problems(root) == []


def test_an_upward_import_fails_even_inside_a_function(tmp_path):
    root = _package(
        tmp_path, {**CLEAN, "runner/store/db.py": "def f():\n    import runner.cli.main\n"}
    )
    assert layer_problems(root) == [
        "runner/store/db.py:2: runner.store.db (store) imports runner.cli.main (cli): "
        "not a lower layer"
    ]


@pytest.mark.parametrize(
    ("rel", "text", "message"),
    [
        ("runner/flowspec/spec.py", "from runner.store import db\n", "runner.store.db (store)"),
        ("runner/handlers/run.py", "from runner.store.db import x\n", "runner.store.db (store)"),
        ("runner/tui/app.py", "import runner.engine.worker\n", "runner.engine.worker (engine)"),
        ("runner/errors.py", "from runner.flowspec import spec\n", "(flowspec): not a lower"),
    ],
    ids=["flowspec-store", "handlers-store", "tui-engine", "ground-subpackage"],
)
def test_a_named_contract_violation_fails(tmp_path, rel, text, message):
    root = _package(tmp_path, {**CLEAN, rel: text})
    problems = layer_problems(root)
    assert len(problems) == 1 and message in problems[0], problems


def test_a_module_importing_the_public_api_fails(tmp_path):
    root = _package(tmp_path, {**CLEAN, "runner/cli/main.py": "from runner.control import x\n"})
    assert layer_problems(root) == [
        "runner/cli/main.py:1: runner.cli.main (cli) imports runner.control (control): "
        "not a lower layer"
    ]


def test_an_unranked_package_fails(tmp_path):
    root = _package(tmp_path, {**CLEAN, "runner/extras/x.py": ""})
    assert layer_problems(root) == ["runner.extras.x: layer 'extras' has no rank in RANK"]


def test_a_cycle_fails(tmp_path):
    root = _package(
        tmp_path,
        {
            **CLEAN,
            "runner/engine/cycle.py": "from runner.engine.worker import Worker\n",
            "runner/engine/worker.py": "from runner.engine import cycle\n",
        },
    )
    assert cycles(root) == [["runner.engine.cycle", "runner.engine.worker"]]


def test_a_facade_fails(tmp_path):
    root = _package(
        tmp_path,
        {
            **CLEAN,
            "runner/control.py": "from runner.errors import x\n__all__ = ['x']\n",
            "runner/store/__init__.py": "from runner.store.db import x\n",
            "runner/engine/cycle.py": "__all__ = ['f']\n",
        },
    )
    assert facade_problems(root) == [
        "runner/engine/cycle.py:1: __all__ (import names from their module)",
        "runner/store/__init__.py:1: package runner.store imports (a facade)",
    ]


# --- dynamic: clean interpreters -------------------------------------------------------

LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(modules: list[str], extra_path: Path | None = None) -> set[str]:
    """The modules a clean interpreter has loaded after importing ``modules``."""
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run(
        [sys.executable, "-c", LOADED, *modules],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


def refused_layers(src: str) -> set[str]:
    """The layers a module of layer ``src`` must not load."""
    return {
        dst for dst in RANK if dst != src and ((src, dst) in FORBIDDEN or RANK[dst] >= RANK[src])
    }


def foreign(loaded: set[str], src: str) -> list[str]:
    """The runner modules in ``loaded`` that layer ``src`` must not load."""
    refused = refused_layers(src)
    return sorted(m for m in loaded if m.startswith("runner.") and layer(m) in refused)


def _importable(name: str) -> bool:
    # alembic's scripts run inside alembic; __main__ modules run the program
    return ".migrations" not in name and not name.endswith("__main__")


@pytest.mark.parametrize("src", sorted(RANK))
def test_importing_a_layer_loads_no_layer_it_must_not_know(src):
    names = [n for n in modules_of(ROOT) if layer(n) == src and _importable(n)]
    assert names
    assert foreign(loaded_by(names), src) == []


def test_the_public_module_declares_and_only_re_exports_its_names():
    import runner.control as api

    # everything public is declared, bar the module's own machinery (``python -m``)
    public = {n for n in dir(api) if not n.startswith("_")}
    assert set(api.__all__) == public - {"TYPE_CHECKING", "annotations", "main"}
    for name in api.__all__:
        defined_in = getattr(getattr(api, name), "__module__", None)
        assert defined_in != PUBLIC, f"{name} is defined in the facade, not re-exported"
    with pytest.raises(AttributeError, match="no attribute 'Worker'"):
        api.Worker  # noqa: B018


EXEC_SIDE = """
import json, sys
from runner.control import EXIT_NOT_YET, checkpoint, data, goto, keepalive, sleep
before = sorted(sys.modules)
from runner.control import Context, LeaseLost, Sleep
print(json.dumps([before, sorted(sys.modules)]))
"""


def test_the_public_modules_exec_side_loads_no_handlers_and_no_asyncio():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", EXEC_SIDE], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    before, after = (set(m) for m in json.loads(proc.stdout))
    runner_before = {m for m in before if m.startswith("runner")}
    assert runner_before == {"runner", "runner.control", "runner.control_channel"}
    assert "asyncio" not in before
    assert "runner.handlers.attempt" in after  # the call side loads on first use


def test_the_dynamic_check_sees_a_violation(tmp_path):
    (tmp_path / "sneaky_engine_part.py").write_text("import runner.service.daemon\n")
    loaded = loaded_by(["sneaky_engine_part"], extra_path=tmp_path)
    assert "runner.service.daemon" in foreign(loaded, "engine")


# --- start-up: what the light commands load --------------------------------------------

RUN = """
import json, sys
from runner.cli.main import main
code = main(sys.argv[1:])
print(json.dumps(sorted(sys.modules)), file=sys.__stderr__)
sys.exit(code)
"""


def run_cli(args: list[str], cwd: Path, **extra_env: str) -> set[str]:
    """The modules loaded by ``flowrun ARGS`` run in a clean interpreter (exit 0)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    proc = subprocess.run(
        [sys.executable, "-c", RUN, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stderr.strip().splitlines()[-1]))


def tops(loaded: set[str]) -> set[str]:
    return {m.split(".")[0] for m in loaded} | {m for m in loaded if m.startswith("runner.")}


def test_help_loads_no_database_console_or_worker(tmp_path):
    loaded = tops(run_cli(["--help"], tmp_path))
    heavy = {"sqlalchemy", "sqlmodel", "pydantic", "alembic", "textual", "rich", "asyncio"}
    assert loaded & heavy == set()
    assert not any(layer(m) not in ("cli", "ground") for m in loaded if m.startswith("runner."))


def test_check_loads_no_store(tmp_path):
    loaded = tops(run_cli(["--flows", str(ROOT / "flows"), "check"], tmp_path))
    assert loaded & {"sqlalchemy", "sqlmodel", "alembic", "textual"} == set()
    assert not [m for m in loaded if layer(m) in ("store", "engine", "ops", "tui", "service")]


def test_ls_on_a_current_database_loads_no_alembic_console_or_worker(tmp_path):
    url = f"sqlite:///{tmp_path / 'flowrun.db'}"
    from runner.store.db import make_engine

    make_engine(url).dispose()  # creates the schema (alembic)
    heavy = {"alembic", "textual", "psycopg", "sqlalchemy", "sqlmodel", "pydantic"}
    for args in (
        ["ls"],
        ["ls", "--json", "--limit", "5"],
        ["workers", "--json"],
        ["events"],
        ["events", "--json"],
    ):
        loaded = tops(run_cli(["--db", url, *args], tmp_path))
        # a SQLite file at this revision is read by stdlib sqlite3 (runner.store.reader)
        assert "sqlite3" in loaded, args
        assert loaded & heavy == set(), args
        # of the console only its plain formatters (the ls table's due and lock words)
        console = {m for m in loaded if layer(m) == "tui"} - {"runner.tui", "runner.tui.fmt"}
        assert console == set(), args
        assert not [m for m in loaded if layer(m) in ("engine", "handlers", "sensors")]


def test_reads_on_a_current_postgresql_database_load_no_sqlalchemy(tmp_path, pg_url):
    """PostgreSQL: the read commands run on psycopg alone (``runner.store.pg_reader``):
    no SQLAlchemy, SQLModel or alembic before their first statement."""
    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    engine = make_engine(pg_url)
    with engine.begin() as conn:
        create_instances(conn, load_flow(ROOT / "flows" / "csv_ingest.yaml"), [{}])
    engine.dispose()
    cache = str(tmp_path / "cache")
    run_cli(["--db", pg_url, "show", "1"], tmp_path, XDG_CACHE_HOME=cache)  # caches facts
    heavy = {"alembic", "textual", "sqlalchemy", "sqlmodel", "pydantic"}
    for args in (
        ["ls", "--limit", "50"],
        ["ls", "--json"],
        ["show", "1"],
        ["explain", "1"],
        ["events", "--limit", "50"],
        ["workers", "--json"],
    ):
        loaded = tops(run_cli(["--db", pg_url, *args], tmp_path, XDG_CACHE_HOME=cache))
        assert "psycopg" in loaded, args
        assert loaded & heavy == set(), args


def test_show_explain_and_ls_load_no_compiler_once_the_flow_facts_are_cached(tmp_path):
    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    url = f"sqlite:///{tmp_path / 'flowrun.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:  # a flow with call states whose module is never imported
        create_instances(conn, load_flow(ROOT / "flows" / "csv_ingest.yaml"), [{}])
    engine.dispose()
    cache = tmp_path / "cache"
    first = tops(run_cli(["--db", url, "show", "1"], tmp_path, XDG_CACHE_HOME=str(cache)))
    assert "runner.flowspec.compiler" in first  # a miss compiles, then writes the facts
    assert len(list((cache / "flowrun" / "facts").glob("*.json"))) == 1
    heavy = {"alembic", "textual", "sqlalchemy", "sqlmodel", "pydantic"}
    for args in (
        ["show", "1"],
        ["show", "--json", "1"],
        ["explain", "1"],
        ["explain", "--json", "1"],
        ["ls", "--limit", "50"],
        ["ls", "--json"],
    ):
        loaded = tops(run_cli(["--db", url, *args], tmp_path, XDG_CACHE_HOME=str(cache)))
        assert loaded & heavy == set(), args
        assert not {"runner.flowspec.compiler", "runner.flowspec.spec"} & loaded, args
        assert "csv_tasks" not in loaded, args


DAEMON_START = """
import json, sys
import runner.service.daemon
from runner.store.db import make_engine
from runner.store.tables import metadata, SQLModel
make_engine(sys.argv[1]).dispose()
built = [c.__name__ for c in SQLModel.__subclasses__() if c.__pydantic_complete__]
print(json.dumps({"modules": sorted(sys.modules), "tables": len(metadata.tables),
                  "built": built}))
"""


def test_a_sqlite_daemon_starts_without_prometheus_or_sensors(tmp_path):
    # what the first claim waits for: the sensor hub comes after the worker's first cycle,
    # prometheus_client only with --metrics
    url = f"sqlite:///{tmp_path / 'flowrun.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", DAEMON_START, url]
    for _ in range(2):  # the first run creates the schema (alembic's migrations)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    loaded = set(out["modules"])
    assert "runner.engine.worker" in loaded  # the check sees the daemon's imports
    # the tables' pydantic validators are built on first use only (``TABLE_CONFIG``):
    # the store writes through their ``Table``s, so a daemon builds none
    assert out["tables"] == 10  # with ``attempt_logs``, ``pools`` and ``deliveries``
    assert out["built"] == []
    assert tops(loaded) & {"prometheus_client", "watchfiles", "croniter", "psycopg"} == set()
    assert not [m for m in loaded if layer(m) == "sensors"]
    # PostgreSQL's column types and statements load only on PostgreSQL
    assert not [m for m in loaded if m.startswith("sqlalchemy.dialects.postgresql")]
    assert "runner.store.batch" not in loaded


def test_the_cli_default_database_is_the_stores():
    from runner.cli.main import DEFAULT_URL
    from runner.store import db

    assert DEFAULT_URL == db.DEFAULT_URL
