"""The console's one rule for text from outside (instance data, labels, errors, handler
output, events and log lines, sensor cursors, worker names, file names, flow names and
anything typed): it is shown literally.

* never read as markup: every widget builds a ``rich.text.Text`` through :func:`text`
  (or appends with :func:`append`), never a markup string; ``[bold]x[/]`` shows as is;
* never passed raw to the terminal: control characters (C0, DEL, C1: ANSI and OSC
  sequences start with one), bidirectional overrides and other invisible format
  characters, line and paragraph separators, and lone surrogates (undecodable bytes kept
  by ``surrogateescape``) are shown as Python-style escapes (``\\x1b``, ``\\u202e``);
* bounded: :func:`visible` clips to ``limit`` characters (each line, for multi-line text)
  and says how many were left out, so a 100 kB log line costs a screen line or a few,
  not a 100 kB layout.

Pure functions of their arguments; they raise nothing for any ``str``/``bytes``/object.
"""

from __future__ import annotations

import re

from rich.text import Text

#: Characters never written to the terminal as they are: C0 controls, DEL and C1
#: controls, soft hyphen, Arabic letter mark, Mongolian vowel separator, zero-width and
#: direction marks, line/paragraph separators, embeddings/overrides/isolates, invisible
#: operators, BOM, interlinear annotation, lone surrogates and tag characters.
_HIDDEN = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)

#: The same but line feeds (multi-line text: JSON, explain).
_HIDDEN_BUT_NEWLINE = re.compile(_HIDDEN.pattern.replace("\x00-\x1f", "\x00-\x09\x0b-\x1f"))

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}

#: Default longest text shown, in characters (before escaping).
LIMIT = 2000


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def as_str(value: object) -> str:
    """``value`` as text: ``""`` for ``None``, bytes decoded as UTF-8 with undecodable
    bytes kept (shown as ``\\xNN`` by :func:`visible`), anything else ``str()``-ed."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else str(value)


def clip(value: str, limit: int | None = LIMIT) -> str:
    """``value`` cut to ``limit`` characters, ending ``… (+N chars)`` when cut
    (``None``: never cut)."""
    if limit is None or len(value) <= limit:
        return value
    return f"{value[:limit]}… (+{len(value) - limit} chars)"


def visible(value: object, limit: int | None = LIMIT, *, multiline: bool = False) -> str:
    """``value`` (any object, see :func:`as_str`) clipped to ``limit`` characters with
    every hidden character (see the module docstring) escaped; with ``multiline`` line
    feeds are kept and each line is clipped on its own, otherwise they show as ``\\n``."""
    raw = as_str(value)
    if multiline:
        lines = raw.split("\n")
        return "\n".join(_HIDDEN_BUT_NEWLINE.sub(_escape, clip(line, limit)) for line in lines)
    return _HIDDEN.sub(_escape, clip(raw, limit))


def one_line(value: object, limit: int = 200) -> str:
    """The first non-blank line of ``value``, stripped, cut to ``limit`` characters and made
    visible (``""`` when there is none)."""
    for line in as_str(value).splitlines():
        if line.strip():
            return visible(line.strip(), limit)
    return ""


def text(
    value: object,
    style: str = "",
    *,
    limit: int | None = LIMIT,
    multiline: bool = False,
    no_wrap: bool = False,
) -> Text:
    """A ``Text`` showing ``value`` literally (:func:`visible`) in ``style`` (a style
    written by the console, never taken from ``value``)."""
    out = Text(visible(value, limit, multiline=multiline), style=style, end="")
    if no_wrap:
        out.no_wrap = True
        out.overflow = "ellipsis"
    return out


def append(out: Text, value: object, style: str = "", *, limit: int | None = LIMIT) -> Text:
    """Append ``value`` to ``out`` literally (:func:`visible`, one line) in ``style``;
    returns ``out``."""
    out.append(visible(value, limit), style=style)
    return out


def cell(value: object, style: str = "", *, limit: int = 200) -> Text:
    """A ``DataTable`` cell (which would read a ``str`` as markup): the first line of
    ``value`` literally, cut to ``limit`` characters."""
    return Text(one_line(value, limit), style=style, no_wrap=True, overflow="ellipsis", end="")
