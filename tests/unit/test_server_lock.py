"""The rule that lets the tests run in several processes (``tests.support.server_lock``):
a ``server_alone`` test runs with no other, and once it waits no new test gets in before
it. Real ``flock`` locks, taken from threads (each opens the files itself, so they
conflict as processes would), on lock files of the test's own."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support import server_lock


def _enter(lock, log: list[str], name: str, inside: threading.Event, leave: threading.Event):
    def run() -> None:
        with lock:
            log.append(name)
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_test_alone_waits_for_those_running_and_goes_before_those_after(tmp_path: Path):
    log: list[str] = []
    ev = {k: (threading.Event(), threading.Event()) for k in ("first", "alone", "after")}
    first = _enter(server_lock.shared(tmp_path), log, "first", *ev["first"])
    assert ev["first"][0].wait(5)
    alone = _enter(server_lock.alone(tmp_path), log, "alone", *ev["alone"])
    assert not ev["alone"][0].wait(0.3), "alone while another test runs"
    after = _enter(server_lock.shared(tmp_path), log, "after", *ev["after"])
    assert not ev["after"][0].wait(0.3), "a new test got in before the one waiting alone"
    ev["first"][1].set()
    assert ev["alone"][0].wait(5)
    assert not ev["after"][0].wait(0.3), "a test ran beside the one alone"
    ev["alone"][1].set()
    assert ev["after"][0].wait(5)
    ev["after"][1].set()
    for t in (first, alone, after):
        t.join(5)
    assert log == ["first", "alone", "after"]


def test_tests_sharing_the_server_run_together(tmp_path: Path):
    log: list[str] = []
    a = (threading.Event(), threading.Event())
    b = (threading.Event(), threading.Event())
    ta = _enter(server_lock.shared(tmp_path), log, "a", *a)
    tb = _enter(server_lock.shared(tmp_path), log, "b", *b)
    assert a[0].wait(5) and b[0].wait(5), "two shared holders at once"
    a[1].set()
    b[1].set()
    ta.join(5)
    tb.join(5)
