"""runner.flowspec.schema: the shipped JSON Schema is generated, current, and validates flows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from runner.flowspec import schema

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = """\
flow: csv_ingest
initial: validate
data: {min_rows: 1}
defaults:
  timeout: 5m
  keepalive: null
  error_budget: {max_errors: 8, window: 4h, on_exhausted: failed}
  backoff: {initial: 10s, factor: 2, max: 10m, jitter: full}
states:
  validate: {exec: [python, -m, v, "{data.path}"], next: done}
  done: {terminal: true}
sensors:
  inbox: {files: {path: inbox, glob: "*.csv", settle: 200ms}}
  nightly: {cron: "0 3 * * *"}
rules:
  - {when: inbox, start: csv_ingest, data: {path: "{event.path}"}}
  - {when: nightly, pause: {flow: csv_ingest}}
"""


def test_shipped_schema_is_current() -> None:
    shipped = (ROOT / "schemas" / "flow.schema.json").read_text(encoding="utf-8")
    assert shipped == schema.render(), "run: python -m runner.flowspec.schema"


def test_schema_uses_yaml_names() -> None:
    s = schema.generate()
    assert s["title"] == "flowrun flow" and s["description"]
    state = s["$defs"]["StateSpec"]["properties"]
    assert {"exec", "next", "on", "to", "call", "external", "terminal"} <= set(state)
    assert not {"exec_", "next_", "on_"} & set(state)
    assert s["additionalProperties"] is False
    assert schema.render().endswith("}\n")


def test_main_writes_file(tmp_path: Path) -> None:
    out = tmp_path / "x" / "flow.schema.json"
    assert schema.main([str(out)]) == 0
    assert out.read_text() == schema.render()


def _validator():
    jsonschema = pytest.importorskip("jsonschema")
    s = json.loads(schema.render())
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def test_schema_validates_an_example_and_rejects_typos() -> None:
    v = _validator()
    doc = YAML(typ="safe").load(EXAMPLE)
    assert list(v.iter_errors(doc)) == []
    doc["defaults"]["tmeout"] = "5m"
    doc["states"]["validate"]["timeout"] = "5 minutes"
    assert len(list(v.iter_errors(doc))) == 2


def test_schema_validates_shipped_example_flows() -> None:
    flows = sorted((ROOT / "flows").glob("*.y*ml"))
    if not flows:
        pytest.skip("no example flows in flows/")
    v = _validator()
    for path in flows:
        doc = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
        problems = [f"{path.name}: {e.message}" for e in v.iter_errors(doc)]
        assert problems == []
