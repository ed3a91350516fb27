"""Stored text made safe to show on a terminal: the one home of the literal-text rule.

Text from outside (data, labels, errors, events, log lines, handler output, file names,
flow descriptions) is shown as it is, never read as markup and never passed raw to the
operator's terminal: :func:`literal` spells every control character, escape sequence
introducer, bidirectional mark and undecodable byte as a visible backslash escape
(``\\x1b``, ``\\t``, ``\\u202e``, ``\\xff`` for the byte ``0xff`` of a file name). The CLI
prints the result as plain text (never through rich markup); the console's widgets and
the daemon's log lines can show text the same way (this module is in the ground layer,
so every layer may import it). Pure: no database, no terminal.
"""

from __future__ import annotations

import re

#: Characters never printed raw: C0 controls (newline only where lines are kept), DEL,
#: C1 controls (``\x9b`` is an 8-bit CSI), the bidirectional marks, embeddings,
#: overrides and isolates (they reorder what follows), other invisible format characters
#: (soft hyphen, zero-width characters, line and paragraph separators, invisible
#: operators, BOM, interlinear annotations, tag characters: the console's set,
#: ``runner.tui.literal``), and lone surrogates (the undecodable bytes of a file name,
#: which no terminal encoding can print).
_UNSAFE = (
    "\x00-\x09\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f"
)
_ONE_LINE = re.compile(f"[\n{_UNSAFE}]")
_LINES = re.compile(f"[{_UNSAFE}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    """The backslash escape of one unsafe character."""
    ch = match.group()
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def literal(text: object, *, lines: bool = False) -> str:
    """``text`` (``str()`` of any value; ``None`` is ``""``) safe to print as it is.

    Every control character but the newline (and the newline too unless ``lines``),
    DEL, the C1 controls, the bidirectional marks and overrides, and lone surrogates
    become visible backslash escapes: ``"a\\x1b[2Jb"`` → ``a\\x1b[2Jb`` (the four
    characters ``\\x1b``), a tab ``\\t``, U+202E ``\\u202e``, the undecodable byte 0xff of
    a file name ``\\xff``. Square brackets and everything else printable stay as they
    are: the result is plain text, to be printed without markup. Never raises.

    Args:
        text: what to show; ``None`` gives ``""``.
        lines: keep newlines (a multi-line block such as a handler's stderr); otherwise
            one line, a newline shown as ``\\n``.
    """
    if text is None:
        return ""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable():  # the common case: nothing to escape
        return s
    return (_LINES if lines else _ONE_LINE).sub(_visible, s)


def one_line(text: object, limit: int | None = None) -> str:
    """The first non-empty line of ``text`` made :func:`literal`, cut to ``limit``
    characters (all when ``None``); ``""`` for ``None`` or blank text. Lines end at a
    newline only: a carriage return stays in the line, shown as ``\\r``."""
    if text is None:
        return ""
    for line in str(text).split("\n"):
        if line.strip():
            out = literal(line.strip())
            return out if limit is None else out[:limit]
    return ""
