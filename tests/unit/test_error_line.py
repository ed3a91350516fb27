"""``runner.error_line.error_line``: the last non-empty line of a kept output tail,
after flowrun's own head, never the tail's first (cut) line."""

from __future__ import annotations

from runner.error_line import error_line

TAIL = "e 38: xxxxxxxx\nnoise line 39: xxxxxxxx\n\nRuntimeError: the real cause\n\n"


def test_one_line_is_itself() -> None:
    assert error_line("exit code 3") == "exit code 3"
    assert error_line("  ValueError: bad (at t.py:4)  ") == "ValueError: bad (at t.py:4)"
    assert error_line(None) == "" and error_line(" \n\n") == ""


def test_the_last_line_of_a_tail_after_the_head() -> None:
    assert error_line("exit code 1: " + TAIL) == "exit code 1: RuntimeError: the real cause"
    assert error_line("killed by signal 9: " + TAIL).endswith(
        "signal 9: RuntimeError: the real cause"
    )
    assert error_line("timeout (60s): " + TAIL) == "timeout (60s): RuntimeError: the real cause"
    memory = "memory limit 512 MiB reached (exit code 1): " + TAIL
    assert (
        error_line(memory)
        == "memory limit 512 MiB reached (exit code 1): RuntimeError: the real cause"
    )
    cpu = "cpu limit 60 s reached (killed by signal 24): " + TAIL
    assert error_line(cpu).startswith("cpu limit 60 s reached (killed by signal 24): Runtime")
    assert error_line("ValueError: first\nsecond") == "second"


def test_a_spent_budget_or_restarts_shows_the_attempt_error() -> None:
    spent = "error budget spent (3 errors in 3600s): exit code 1: " + TAIL
    assert error_line(spent) == "exit code 1: RuntimeError: the real cause"
    last = "restarts spent (6 > max_restarts 5); last: timeout (5s): " + TAIL
    assert error_line(last) == "timeout (5s): RuntimeError: the real cause"
    alone = "restarts spent: 6 lost attempts in state 'a' (max_restarts 5)"
    assert error_line(alone) == alone


def test_limit_cuts_with_an_ellipsis() -> None:
    assert error_line("exit code 1: " + TAIL, 20) == "exit code 1: Runtim…"
    assert error_line("short", 20) == "short"


def test_spent_keeps_the_wrapper_in_front() -> None:
    spent = "error budget spent (3 errors in 3600s): exit code 1: " + TAIL
    assert error_line(spent, spent=True) == (
        "error budget spent (3 errors in 3600s): exit code 1: RuntimeError: the real cause"
    )
    assert error_line("exit code 2", spent=True) == "exit code 2"
