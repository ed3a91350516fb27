"""Bounds on what reading one flow file may cost, and the bytes a flow file may hold.

Anyone who can write into the flows folder can hand the loader (``flowrun check``, the
daemon's hot reload) a hostile file: an alias bomb ("billion laughs"), a list nested
10,000 deep, a file of many megabytes, bytes that are not text. Each is refused here,
before ruamel.yaml builds anything, with ONE positioned error:

- :data:`MAX_FILE_BYTES`: larger files are not read (only that many bytes are).
- UTF-8 only, and no control character other than tab, LF and CR: the message gives the
  ``line:col`` of the offending byte or character.
- :data:`MAX_DEPTH`: collections nested deeper are refused where the scanner meets them
  (ruamel's scanner is quadratic in the nesting of flow collections, its composer
  recursive), so a deep file costs only the first :data:`MAX_DEPTH` levels.
- :data:`MAX_NODES`: the values of the document with every alias expanded (an alias
  counts the size of what it names), checked event by event while ruamel composes: an
  alias bomb stops at the alias that crosses the bound. An alias to a collection that is
  still open (``&a {y: *a}``, a recursive structure) is refused at the alias.
- :data:`MAX_NUMBER_CHARS`: a plain number longer than that (Python refuses to convert
  integers of more than 4300 digits, and no flow needs such a number).
- :data:`MAX_SECONDS`: a safety net on the wall time of scanning and composing.

The figures are documented in ``docs/limits.md``. The checks ride on ruamel's own
scanner and parser (subclasses, see :func:`guarded_yaml`): the file is parsed once.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceStartEvent,
)
from ruamel.yaml.parser import RoundTripParser
from ruamel.yaml.scanner import RoundTripScanner

from runner.errors import FlowError, FlowErrors

MAX_FILE_BYTES = 128 * 1024
"""Largest flow file read, in bytes (128 KiB, about 2,500 states; the example flow is
1.6 KiB). ruamel.yaml reads about 50 KiB per CPU second: this bounds a reload's cost."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists (a flow's own keys need 5)."""
MAX_NODES = 50_000
"""Most values (scalars, mappings, lists) in one file, with every alias expanded."""
MAX_NUMBER_CHARS = 100
"""Longest plain scalar that reads as a number."""
MAX_SECONDS = 5.0
"""Bound on the CPU time (of the loading thread) spent scanning and composing one file:
a safety net above what the other bounds allow (a dense 128 KiB file takes 1-3 s). CPU
time, not wall time, so a loaded machine does not turn a good file into a bad one."""

# C0 controls but tab, LF, CR; DEL; C1 controls (NEL included: YAML would count it as a
# line break where editors do not); lone surrogates; the non-characters U+FFFE/U+FFFF.
_BAD_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_NUMBER = re.compile(r"[-+]?(?:[0-9_.]+(?:[eE][-+]?[0-9]+)?|0x[0-9a-fA-F_]+|0o[0-7_]+)")


class LimitError(Exception):
    """One input that crosses a bound, at a 1-based ``line``/``col`` of the file."""

    def __init__(self, message: str, line: int, col: int):
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


def _size(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / 1024 / 1024:.1f} MiB"
    return f"{n / 1024:.0f} KiB" if n % 1024 == 0 or n > 10 * 1024 else f"{n} bytes"


def read_flow_file(path: str | Path) -> str:
    """The text of the flow file at ``path``, read within :data:`MAX_FILE_BYTES`.

    Raises:
        FlowErrors: one ``FlowError`` (with ``file:line:col`` whenever the problem has a
            place): the file cannot be opened, is too large, is not UTF-8, or holds a
            control character.
    """
    file = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FlowErrors([FlowError("not a regular file", file)])
            data = fh.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                fh.seek(0, 2)
                raise FlowErrors([FlowError(_too_large(fh.tell()), file, 1, 1)])
    except OSError as exc:
        message = f"cannot read flow file: {exc.strerror or exc}"
        raise FlowErrors([FlowError(message, file)]) from None
    try:
        return decode(data)
    except LimitError as exc:
        raise FlowErrors([FlowError(exc.message, file, exc.line, exc.col)]) from None


def decode(data: bytes) -> str:
    """``data`` decoded as UTF-8 and checked by :func:`check_chars`.

    Raises:
        LimitError: at the first byte that is not UTF-8, or the first bad character.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        col = len(data[start : exc.start].decode("utf-8", errors="replace")) + 1
        raise LimitError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded "
            "(save the flow file as UTF-8)",
            line,
            col,
        ) from None
    check_chars(text)
    return text


def check_text(text: str) -> None:
    """Refuse text longer than :data:`MAX_FILE_BYTES` (in UTF-8) or holding a character
    :func:`check_chars` refuses.

    Raises:
        LimitError: the first problem, with its position (1:1 for the size).
    """
    if len(text) > MAX_FILE_BYTES and len(text.encode("utf-8", "replace")) > MAX_FILE_BYTES:
        raise LimitError(_too_large(len(text.encode("utf-8", "replace"))), 1, 1)
    check_chars(text)


def _too_large(size: int) -> str:
    limit = _size(MAX_FILE_BYTES)
    return f"flow file too large: {_size(size)} (at most {limit}, see docs/limits.md)"


def check_chars(text: str) -> None:
    """Refuse a control character (but tab, LF, CR), a lone surrogate or U+FFFE/FFFF.

    Raises:
        LimitError: at the first one, naming its code point.
    """
    m = _BAD_CHAR.search(text)
    if m is None:
        return
    at = m.start()
    line = text.count("\n", 0, at) + 1
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    raise LimitError(
        f"character U+{ord(text[at]):04X} is not allowed in a flow file (control "
        "characters other than tab and line breaks, and non-characters, are refused)",
        line,
        col,
    )


class _Guard:
    """The per-load state the guarded scanner and parser share (one document)."""

    def __init__(self, file: str, errors: list[FlowError], seconds: float) -> None:
        self.file, self.errors = file, errors
        self.deadline = time.thread_time() + seconds
        self.nodes = 0
        # open collections: [anchor, size, {key: first line}, next scalar is a key, is map]
        self.stack: list[list[Any]] = []
        self.sizes: dict[str, int] = {}  # anchor -> expanded size of what it names

    def tick(self, mark: Any) -> None:
        if time.thread_time() > self.deadline:
            raise LimitError(
                f"flow file takes longer than {MAX_SECONDS:g}s to read (see docs/limits.md)",
                *_pos(mark),
            )

    def count(self, n: int, mark: Any) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            raise LimitError(
                f"flow file too large: more than {MAX_NODES} values with aliases expanded "
                "(see docs/limits.md)",
                *_pos(mark),
            )
        if self.stack:
            self.stack[-1][1] += n

    def see(self, ev: Any) -> None:
        """Account one parser event (in document order)."""
        mark = ev.start_mark
        self.tick(mark)
        if isinstance(ev, ScalarEvent | MappingStartEvent | SequenceStartEvent | AliasEvent):
            self._key_or_tag(ev)
        if isinstance(ev, AliasEvent):
            if any(f[0] == ev.anchor for f in self.stack):
                raise LimitError(
                    f"alias *{ev.anchor} refers to the collection it is in (a recursive "
                    "structure, which flow files cannot hold)",
                    *_pos(mark),
                )
            self.count(self.sizes.get(ev.anchor, 1), mark)
        elif isinstance(ev, ScalarEvent):
            value = ev.value
            if ev.style is None and len(value) > MAX_NUMBER_CHARS and _NUMBER.fullmatch(value):
                raise LimitError(
                    f"number too long: {len(value)} characters (at most {MAX_NUMBER_CHARS})",
                    *_pos(mark),
                )
            self.count(1, mark)
            if ev.anchor is not None:
                self.sizes[ev.anchor] = 1
        elif isinstance(ev, MappingStartEvent | SequenceStartEvent):
            if len(self.stack) >= MAX_DEPTH:
                raise _too_deep(mark)
            self.count(1, mark)
            self.stack.append([ev.anchor, 0, {}, True, isinstance(ev, MappingStartEvent)])
        elif isinstance(ev, CollectionEndEvent) and self.stack:
            anchor, size, *_ = self.stack.pop()
            if anchor is not None:
                self.sizes[anchor] = size + 1
            if self.stack:
                self.stack[-1][1] += size

    def _key_or_tag(self, ev: Any) -> None:
        """Collect (not raise) explicit tags and duplicate keys."""
        tag = getattr(ev, "tag", None)
        if tag is not None and not isinstance(ev, AliasEvent):
            self.errors.append(
                FlowError(
                    f"YAML tag {_tag(tag)} is not allowed (flow files are plain data: no tags)",
                    self.file,
                    *_pos(ev.start_mark),
                )
            )
        if not self.stack or not self.stack[-1][4]:
            return
        top = self.stack[-1]
        if top[3] and isinstance(ev, ScalarEvent) and ev.value != "<<":
            if ev.value in top[2]:
                self.errors.append(
                    FlowError(
                        f"duplicate key '{ev.value}' (first defined at line {top[2][ev.value]})",
                        self.file,
                        *_pos(ev.start_mark),
                    )
                )
            else:
                top[2][ev.value] = ev.start_mark.line + 1
        top[3] = not top[3]


def _pos(mark: Any) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _tag(tag: Any) -> str:
    text = str(getattr(tag, "value", tag))
    return "!!" + text[len("tag:yaml.org,2002:") :] if text.startswith("tag:yaml.org,") else text


def _too_deep(mark: Any) -> LimitError:
    return LimitError(
        f"nested too deep: more than {MAX_DEPTH} levels of mappings and lists (see docs/limits.md)",
        *_pos(mark),
    )


class _Scanner(RoundTripScanner):
    """ruamel's scanner, refusing deep nesting as it meets it and watching the clock."""

    def fetch_more_tokens(self) -> Any:
        self.loader.flowrun_guard.tick(self.reader)
        return super().fetch_more_tokens()

    def fetch_flow_collection_start(self, TokenClass: Any, to_push: Any) -> None:
        if self.flow_level + len(self.indents) >= MAX_DEPTH:
            raise _too_deep(self.reader)
        super().fetch_flow_collection_start(TokenClass, to_push)

    def add_indent(self, column: int) -> bool:
        if self.indent < column and len(self.indents) >= MAX_DEPTH:
            raise _too_deep(self.reader)
        return super().add_indent(column)


class _Parser(RoundTripParser):
    """ruamel's round-trip parser, showing every event to the load's ``_Guard``."""

    def get_event(self) -> Any:
        ev = super().get_event()
        if ev is not None:
            self.loader.flowrun_guard.see(ev)
        return ev


def guarded_yaml(file: str, errors: list[FlowError], seconds: float = MAX_SECONDS) -> YAML:
    """A round-trip ``YAML`` loader (duplicate keys allowed: they are reported) whose
    ``load`` enforces every bound of this module.

    Args:
        file: the flow file's path, for the messages.
        errors: list to which explicit tags and duplicate keys are appended (the load
            carries on past them).
        seconds: the time bound.

    ``load`` raises ``LimitError`` for a bound crossed, ruamel's ``MarkedYAMLError`` for
    a syntax error.
    """
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = True
    yaml.Scanner = _Scanner
    yaml.Parser = _Parser
    yaml.flowrun_guard = _Guard(file, errors, seconds)  # type: ignore[attr-defined]  # ours
    return yaml
