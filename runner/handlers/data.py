"""A handler's instance data: in its environment, or in a file when too large for it.

Instance data reaches the handler in ``FLOWRUN_DATA`` while its JSON is at most
:data:`DATA_INLINE_MAX` bytes. Larger data (an environment string is capped at 128 kB by
Linux, and all of them together at a quarter of the stack limit) goes to a private file
named by ``FLOWRUN_DATA_FILE`` instead, removed when the attempt ends
(``runner.handlers.exec_handler``).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

#: ``json.dumps(..., separators=(",", ":"))`` without building an encoder per call
_compact_json = json.JSONEncoder(separators=(",", ":")).encode
#: Largest JSON (bytes) passed inline in ``FLOWRUN_DATA``; larger goes to a file.
DATA_INLINE_MAX = 64 * 1024
DATA_ENV = "FLOWRUN_DATA"
DATA_FILE_ENV = "FLOWRUN_DATA_FILE"


def data_env(data: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """``({FLOWRUN_DATA: json} or {FLOWRUN_DATA_FILE: path}, path or None)``.

    Large data is written to a file readable by the owner only, in the system's temporary
    folder; the caller removes it (:func:`remove_data_file`). Raises ``OSError`` if the
    file cannot be written.
    """
    text = _compact_json(data)
    if len(text) <= DATA_INLINE_MAX:  # characters ≤ bytes: the file path is rarely taken
        return {DATA_ENV: text}, None
    fd, path = tempfile.mkstemp(prefix="flowrun-data-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except BaseException:
        remove_data_file(path)
        raise
    return {DATA_FILE_ENV: path}, path


def remove_data_file(path: str | None) -> None:
    """Remove a data file written by :func:`data_env` (a missing file is fine)."""
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
