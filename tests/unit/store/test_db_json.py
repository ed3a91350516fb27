"""The JSON adapter and loader of the hot statements (``Dialect.json_adapter``/``json_loader``):
their fast paths must write and read exactly what the ``json`` module would, through a
real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from runner.store.db import make_engine
from runner.store.dialect import dialect_of
from runner.store.json_codec import loads_bytes


def json_adapter(engine):
    return dialect_of(engine).json_adapter()


def json_loader(engine):
    return dialect_of(engine).json_loader()


VALUES = [
    [],
    [1763832000.123456],
    [1.0, 2e20, 1e-7, -3.25, 0.1],
    [1, 2.0],
    [1.5, "a"],
    [float("inf")],
    {"i": 1, "nested": {"a": [1.5, None, True]}, "s": 'ü\n"q"'},
    "text",
    3,
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_adapter_writes_what_the_json_module_writes(tmp_path: Path, value) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'j.db'}")
    adapt, load = json_adapter(engine), json_loader(engine)
    written = adapt(value)
    assert written == json.dumps(value, separators=(",", ":"))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE j (v JSON)"))
        conn.execute(text("INSERT INTO j VALUES (:v)"), {"v": written})
        stored = conn.execute(text("SELECT v, json_valid(v) FROM j")).one()
    assert load(stored[0]) == value
    if value != [float("inf")]:  # Infinity is not JSON (the json module writes it anyway)
        assert stored[1] == 1, "SQLite's own JSON functions can read it"


def test_adapter_keeps_none_as_sql_null() -> None:
    assert json_adapter(make_engine("sqlite://"))(None) is None


@pytest.mark.parametrize("raw", [' {"a": 1} ', "[1.5]\n", '{"a":1}'])
def test_loader_reads_any_valid_text(raw: str) -> None:
    assert json_loader(make_engine("sqlite://"))(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", ["{bad", '{"a":1} x', ""])
def test_loader_raises_on_invalid_text(raw: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json_loader(make_engine("sqlite://"))(raw)


def test_loader_passes_decoded_values_through() -> None:
    load = json_loader(make_engine("sqlite://"))
    assert load(None) is None and load({"x": 1}) == {"x": 1}


DOCUMENTS = [b"{}", b"[]", b'{"a": [1.5, null, true], "s": "\\u00fc\\n"}', ' ["ü"] '.encode(), b"3"]


@pytest.mark.parametrize("raw", DOCUMENTS, ids=repr)
def test_the_jsonb_loader_reads_what_json_loads_reads(raw: bytes) -> None:
    """What psycopg calls for each jsonb value on PostgreSQL (``pg_engine.pg_engine``)."""
    assert loads_bytes(raw) == json.loads(raw)


def test_the_jsonb_loader_builds_a_new_empty_value_each_time() -> None:
    load = loads_bytes
    first, second = load(b"{}"), load(b"{}")
    first["x"] = 1
    assert second == {} and load(b"[]") is not load(b"[]")


@pytest.mark.parametrize("raw", [b"{bad", b'{"a":1} x', b""])
def test_the_jsonb_loader_raises_on_invalid_documents(raw: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads_bytes(raw)
