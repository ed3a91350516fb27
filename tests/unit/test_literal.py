"""``runner.literal``: every hostile text of ``tests.support.hostile`` made safe to print,
its printable parts kept verbatim."""

from __future__ import annotations

import pytest

from runner.literal import literal, one_line
from tests.support.hostile import INVALID_UTF8, INVALID_UTF8_SHOWN, TEXTS, missing, raw_controls


@pytest.mark.parametrize("case", TEXTS, ids=lambda c: c.name)
def test_hostile_text_shown_literally(case) -> None:
    for lines in (False, True):
        out = literal(case.text, lines=lines)
        assert not raw_controls(out) and not missing(out, case), out[:200]
        out.encode("utf-8")  # printable on any UTF-8 terminal


def test_escapes_are_visible_and_markup_untouched() -> None:
    assert literal("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert literal("[bold red]x[/]") == "[bold red]x[/]"
    assert literal("x\ty\r\nz") == "x\\ty\\r\\nz"
    assert literal("x\ty\r\nz", lines=True) == "x\\ty\\r\nz"
    assert literal("\x00\x7f\x9b\u202e") == "\\x00\\x7f\\x9b\\u202e"
    assert literal(None) == "" and literal(42) == "42"
    # invisible format characters too: zero width, line separator, BOM, tag characters
    assert literal("a\u200bb\u2028c\ufeffd\U000e0041") == "a\\u200bb\\u2028c\\ufeffd\\U000e0041"


def test_undecodable_bytes_show_as_bytes() -> None:
    name = INVALID_UTF8.decode("utf-8", "surrogateescape")  # a file name as Python reads it
    out = literal(name)
    assert out.startswith("caf\\xe9 \\xff\\xfe [bold]x[/] \\x1b[2J")
    assert all(s in out for s in INVALID_UTF8_SHOWN) and not raw_controls(out)
    out.encode("utf-8")


def test_one_line_keeps_a_carriage_return_in_the_line() -> None:
    assert one_line("\n  first\rsame line \x1b[31m\nsecond") == "first\\rsame line \\x1b[31m"
    assert one_line("abcdef", 3) == "abc" and one_line(None) == "" and one_line(" \n ") == ""
