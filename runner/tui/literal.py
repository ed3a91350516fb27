"""The console's one rule for text from outside (instance data, labels, errors, handler
output, events and log lines, sensor cursors, worker names, file names, flow names and
anything typed): it is shown literally.

* never read as markup: every widget builds a ``rich.text.Text`` through :func:`text`
  (or appends with :func:`append`), never a markup string; ``[bold]x[/]`` shows as is;
* never passed raw to the terminal: control characters (C0, DEL, C1: ANSI and OSC
  sequences start with one), bidirectional overrides and other invisible format
  characters, line and paragraph separators, and lone surrogates (undecodable bytes kept
  by ``surrogateescape``) are shown as Python-style escapes (``\\x1b``, ``\\u202e``) by
  ``runner.literal.literal``, the rule's one home, which the CLI uses too;
* bounded: :func:`visible` clips to ``limit`` characters (each line, for multi-line text)
  and says how many were left out, so a 100 kB log line costs a screen line or a few,
  not a 100 kB layout.

Pure functions of their arguments; they raise nothing for any ``str``/``bytes``/object.
"""

from __future__ import annotations

from rich.text import Text

from runner.literal import literal

#: Default longest text shown, in characters (before escaping).
LIMIT = 2000


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
        return "\n".join(literal(clip(line, limit), lines=True) for line in lines)
    return literal(clip(raw, limit))


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
