"""The error line of an attempt or an instance: the one line the listings show.

An attempt's stored error (``attempts.error``, ``instances.last_error``) is what happened
(``exit code 1``, ``timeout (60s)``; an instance's maybe after ``error budget spent
(...): ``) followed by the kept tail of the handler's output (the last 4 kB of stderr,
or of stdout when stderr is empty), which usually starts mid-line and ends with the
line that matters (a Python traceback's ``ValueError: ...``, a tool's last complaint).
:func:`error_line` keeps the attempt's head and the last non-empty line of the tail.
``flowrun ls``, ``explain``, the console's table, detail and explanation and the
daemon's log lines all show this line; ``flowrun show`` and ``--json`` give the whole
stored text. Ground level: every layer may use it.
"""

from __future__ import annotations

import re

#: How an instance's ``last_error`` quotes the attempt error that spent its error budget
#: or its restarts (the status, ``failed`` or ``paused``, already says so).
_SPENT = re.compile(r"error budget spent \([^)]*\): |restarts spent \([^)]*\); last: ")

#: What flowrun puts before a handler's output tail.
_HEAD = re.compile(
    r"(?:exit code -?\d+|killed by signal \d+|timeout \([^)]*\)|missed keepalive \([^)]*\)"
    r"|(?:memory|cpu) limit [^(:]* reached \((?:exit code -?\d+|killed by signal \d+)\)): "
)


def error_line(text: str | None, limit: int | None = None, *, spent: bool = False) -> str:
    """The line to show for a stored error ``text``: its only non-empty line, or, when the
    text spans several lines, flowrun's head (``exit code 1: ``...) followed by the last
    non-empty line; stripped, and cut to ``limit`` characters (ending ``…``) when given.
    The ``error budget spent (...): `` / ``restarts spent (...); last: `` in front of an
    attempt's error is left out (the attempt's error is the error), unless ``spent``
    (then it leads the line, e.g. in the log line of an instance that failed). ``""`` for
    ``None`` or blank text. Raises nothing."""
    text, lead = text or "", ""
    wrapper = _SPENT.match(text)
    if wrapper is not None and text[wrapper.end() :].strip():
        text = text[wrapper.end() :]
        lead = wrapper.group(0) if spent else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0]
    if len(lines) > 1:
        head = _HEAD.match(line)
        line = (head.group(0) if head else "") + lines[-1]
    line = lead + line
    if limit is not None and len(line) > limit:
        line = line[: max(0, limit - 1)] + "…"
    return line
