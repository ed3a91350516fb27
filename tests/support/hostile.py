"""Hostile flow files (issue 18), shared by the loader tests, the CLI and daemon tests and
``bench/hostile_flows.py``: each is the file's bytes and the ``line:col`` plus message
fragment its one error must carry."""

from __future__ import annotations

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
