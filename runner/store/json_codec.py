"""SQLite's JSON columns to and from Python, fast, with the ``json`` module alone.

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
    scan = json.JSONDecoder().scan_once

    def load(v: Any) -> Any:
        if not isinstance(v, str):
            return v
        try:
            value, end = scan(v, 0)
        except StopIteration:
            return json.loads(v)
        return value if end == len(v) else json.loads(v)

    return load


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
