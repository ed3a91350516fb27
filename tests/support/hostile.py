"""Hostile input shared by the tests and ``bench/hostile_flows.py``.

Hostile flow files (``CASES``): each is the file's bytes and the ``line:col`` plus
message fragment its one error must carry.

Hostile text (``TEXTS``, ``INVALID_UTF8``): stored text (data, labels, errors, events,
log lines, file names) that every display, the CLI's and the console's, must show
literally: each case's ``shown`` fragments verbatim and no raw control character
(``raw_controls``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

GOOD = "initial: a\nstates:\n  a: {terminal: true}\n"


@dataclass(frozen=True)
class Hostile:
    """One hostile flow file: ``name`` (also the file stem), its bytes, and what
    ``flowrun check`` must say: the position and a fragment of the message."""

    name: str
    data: bytes
    line: int
    col: int
    says: str


def billion_laughs() -> bytes:
    """Nine levels of nine aliases each: 9**9 (387 million) strings once expanded."""
    lines = [
        "initial: a",
        "data:",
        '  l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    ]
    for i in range(1, 10):
        lines.append(f"  l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    lines += ["states:", "  a: {terminal: true}"]
    return ("\n".join(lines) + "\n").encode()


def deep_list(depth: int = 10_000) -> bytes:
    """A flow list nested ``depth`` deep in ``data:`` (line 3, from column 6)."""
    return ("initial: a\ndata:\n  x: " + "[" * depth + "]" * depth + "\n" + GOOD[11:]).encode()


def big_file(size: int = 10 * 1024 * 1024) -> bytes:
    """A valid-looking flow of about ``size`` bytes (a long ``data:`` mapping)."""
    line = "  k{:07d}: " + "x" * 70 + "\n"
    count = size // len(line.format(0))
    return (GOOD + "data:\n" + "".join(line.format(i) for i in range(count))).encode()


CASES = [
    # the bomb stops at the alias that crosses the bound (line 7: l4 names 9**5 values)
    Hostile("laughs", billion_laughs(), 7, 32, "with aliases expanded"),
    Hostile("deep", deep_list(), 3, 68, "nested too deep"),
    Hostile("big", big_file(), 1, 1, "MiB (at most 128 KiB"),
    Hostile(
        "selfref",
        b"initial: a\ndata: {x: &a {y: *a}}\nstates:\n  a: {terminal: true}\n",
        2,
        18,
        "alias *a refers to the collection it is in",
    ),
    Hostile(
        "latin",
        b"initial: a\nstates:\n  a: {terminal: true}\ndescription: caf\xe9 au lait\n",
        4,
        17,
        "not UTF-8 text: byte 0xe9",
    ),
    Hostile("nul", b"initial: a\nstates:\n  a: {te\x00rminal: true}\n", 3, 9, "U+0000"),
    Hostile(
        "c1",
        "initial: a\nstates:\n  a: {terminal: true}\ndescription: n\u00e9\u009bx\n".encode(),
        4,
        16,
        "U+009B",
    ),
]
"""Every hostile file of the issue; each must be rejected with exactly one error."""


# --- hostile text: what operators' screens must show literally -------------------------


@dataclass(frozen=True)
class HostileText:
    """One hostile piece of stored text (a data value, label, error, log line, file name).

    ``text`` goes in as it is; a display (CLI text, console view) must contain each of
    ``shown`` verbatim (the printable parts, in order of appearance, short enough to
    survive clipping to 40 cells) and none of :data:`RAW_CONTROLS` (:func:`raw_controls`).
    """

    name: str
    text: str
    shown: tuple[str, ...]


#: Characters that must never reach a terminal raw: C0 controls but newline, DEL, C1
#: controls, the bidirectional marks, embeddings, overrides and isolates, and lone
#: surrogates (undecodable bytes of a file name, which no terminal encoding can print).
RAW_CONTROLS = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)

#: 100 kB on one line with markup at both ends (a runaway log line).
LONG_LINE = "[long] " + "x" * 100_000 + " [/end]"

TEXTS: tuple[HostileText, ...] = (
    HostileText(
        "brackets",
        "ERROR [cache] code=502 evicted [/var/lib/app] entries",
        ("ERROR [cache] code=502 evicted [/var/lib/app]",),
    ),
    HostileText("stderr", "open failed for [/var/lib/app/state.db]", ("[/var/lib/app/state.db]",)),
    HostileText("tag", "[payments]", ("[payments]",)),
    HostileText("markup", "[bold red]disk[/] full", ("[bold red]disk[/] full",)),
    HostileText("closing", "[/] and [/bold] and [link=file:///etc]x[/link]", ("[/] and [/bold]",)),
    HostileText("backslash", "C:\\temp\\[x] \\[y]", ("C:\\temp\\[x] \\[y]",)),
    HostileText("clear", "name\x1b[2J\x1b[Hafter", ("name", "[2J", "[Hafter")),
    HostileText("colour", "\x1b[31mred\x1b[0m plain", ("[31mred", "[0m plain")),
    HostileText("osc", "\x1b]0;owned title\x07tail", ("]0;owned title", "tail")),
    HostileText(
        "osc8", "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\", ("http://evil.example/",)
    ),
    HostileText("csi8bit", "a\x9b31mb", ("a", "31mb")),
    HostileText("nul", "before\x00after", ("before", "after")),
    HostileText("controls", "bell\x07 back\x08 del\x7f cr\rlf", ("bell", "back", "del", "lf")),
    HostileText("tab", "col1\tcol2", ("col1", "col2")),
    HostileText("rtl", "invoice\u202egnp.exe\u200f\u2067x\u2069", ("invoice", "gnp.exe")),
    HostileText("long", LONG_LINE, ("[long] xxxxxxxxxxxxxxxx",)),
    HostileText("replaced", "caf\ufffd \ufffd\ufffd [x]", ("caf\ufffd \ufffd\ufffd [x]",)),
)
"""Every hostile text, one per kind of trouble."""

#: Bytes that are not UTF-8, with markup and an escape sequence in them (a handler's
#: stderr, a tailed log line, a file name).
INVALID_UTF8 = b"caf\xe9 \xff\xfe [bold]x[/] \x1b[2J end"

#: The printable fragments any display of :data:`INVALID_UTF8` (however decoded) shows.
INVALID_UTF8_SHOWN = ("[bold]x[/]", "[2J end")


def raw_controls(output: str) -> list[str]:
    """The characters of ``output`` that must never reach a terminal raw (escape
    sequences, controls, bidi marks, lone surrogates), as ``repr`` strings; ``[]`` when
    ``output`` is safe to print."""
    return [repr(m.group()) for m in RAW_CONTROLS.finditer(output)]


def missing(output: str, case: HostileText) -> list[str]:
    """The fragments of ``case.shown`` that ``output`` does not contain verbatim."""
    return [s for s in case.shown if s not in output]
