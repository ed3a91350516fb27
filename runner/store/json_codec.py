"""SQLite's JSON columns to and from Python, fast, with the ``json`` module alone (and
PostgreSQL's ``jsonb`` values as psycopg reads them, :func:`loads_bytes`).

Both the worker's prepared statements (``runner.store.dialect.SQLITE``) and the read side
run without SQLAlchemy's JSON type (``runner.store.reader``: the CLI reads a SQLite file
through stdlib ``sqlite3``) decode through :func:`sqlite_json_loader`, so a JSON column
reads the same whichever path read it. No SQLAlchemy here: ``flowrun ls`` imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def sqlite_json_loader() -> Callable[[Any], Any]:
    """A function turning a JSON column's stored text into Python (``None`` and values the
    driver already decoded pass through).

    SQLite hands back the stored text, decoded by the C scanner directly (``json.loads``
    costs four times as much in its Python layers; the claim decodes two columns per
    instance). Anything the scanner does not consume whole (surrounding whitespace) goes
    through ``json.loads``, which also raises the usual ``JSONDecodeError`` for invalid
    text."""
    scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__

    def load(v: Any) -> Any:
        if not isinstance(v, str):
            return v
        try:
            value, end = scan(v, 0)
        except StopIteration:
            return json.loads(v)
        return value if end == len(v) else json.loads(v)

    return load


def loads_bytes(data: bytes) -> Any:
    """A JSON document in bytes (UTF-8) as Python, equal to ``json.loads`` and faster:
    what psycopg calls for every ``jsonb`` value it reads on PostgreSQL
    (``runner.store.pg_engine.pg_engine``; a module-level function: psycopg keeps one loader
    class per function it is given).

    psycopg's default, ``json.loads`` on bytes, first guesses the encoding
    (``json.detect_encoding``) and goes through the module's Python layers: ~2.5 us for
    each of the two JSON columns of every claimed instance here. This decodes UTF-8
    (what PostgreSQL sends to a UTF8 client, as ``json.loads`` assumes too) and runs the C
    scanner directly, like :func:`sqlite_json_loader`; the empty object and list (an
    instance's ``data`` and ``state_errors``, usually) are built without it. Raises
    ``json.JSONDecodeError`` as ``json.loads`` does."""
    if len(data) == 2:
        if data == b"{}":
            return {}
        if data == b"[]":
            return []
    return _load_text(data.decode())


def sqlite_json_adapter() -> Callable[[Any], Any]:
    """A function turning a Python value into the JSON text of a parameter.

    A list of finite floats (an error budget's timestamps, written with every failed or
    moved attempt) is spelled by ``repr`` directly, as the JSON encoder would spell it, at
    a third of the encoder's cost."""
    encode = json.JSONEncoder(separators=(",", ":")).encode  # built once: dumps() with
    # options builds a new encoder per call, which cost more than the encoding

    def adapt(v: Any) -> Any:
        if v is None:
            return None
        if type(v) is list:
            if not v:
                return "[]"
            for x in v:
                if type(x) is not float:
                    break
            else:
                spelled = repr(v)
                if "n" not in spelled:  # no inf or nan: those JSON spells differently
                    return spelled.replace(" ", "")
        return encode(v)

    return adapt


_load_text = sqlite_json_loader()
