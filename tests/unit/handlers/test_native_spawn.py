"""The C spawn path (``runner.handlers._spawn`` through ``runner.handlers.native``) against
the Python one: same errors, no descriptor or zombie left, the reaper never takes a handler
the loop has not taken over, ``FLOWRUN_SPAWN=python``. Real
processes; no timing assertions."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from runner.handlers import native, reaper
from tests.support.fault import poll
from tests.unit.handlers.test_executor import run

needs_c = pytest.mark.skipif(native.ext is None, reason="C spawn path not in use")


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _zombie_children() -> list[int]:
    """Our children (of any thread: handlers are children of the threads that spawned
    them) that are zombies."""
    children = reaper._children(tuple(os.listdir("/proc/self/task")))
    return [pid for pid, (state, _sid) in children.items() if state == "Z"]


def test_many_attempts_leave_no_descriptor_and_no_zombie(tmp_path: Path, spawn_path: str) -> None:
    """60 attempts at once (clean exits, failures, a missing program): afterwards no
    descriptor is open that was not before (but for the lasting ones: /dev/null, epoll
    sets, the loop's eventfd until its loop is seen closed) and no child is a zombie."""

    async def main() -> list[str]:
        argvs = [["/bin/true"], ["/bin/false"], ["/no/such/program"]] * 20
        done = await asyncio.gather(*(run(a, tmp_path) for a in argvs))
        return [r.outcome for r in done]

    asyncio.run(main())  # the first run opens what lasts (threads' pipes, /dev/null, ...)
    before = _open_fds()
    outcomes = asyncio.run(main())
    assert outcomes == ["moved", "error", "error"] * 20
    poll(lambda: len(_open_fds() - before) == 0, what="no descriptor left")
    poll(lambda: not _zombie_children(), what="no zombie left")


@pytest.mark.parametrize(
    ("argv", "cwd"),
    [
        (["/no/such/program"], None),
        (["no-such-program-anywhere"], None),
        (["./not-executable"], None),
        (["/bin/true"], "gone"),
    ],
    ids=["missing", "not-on-path", "not-executable", "bad-cwd"],
)
@needs_c
def test_what_cannot_start_reads_the_same_on_both_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], cwd: str | None
) -> None:
    """The attempt's error for a program or folder that cannot be used is the same text
    whichever path started it."""
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    folder = tmp_path / cwd if cwd else tmp_path
    by_c = asyncio.run(run(argv, folder))
    monkeypatch.setattr(native, "ext", None)
    by_python = asyncio.run(run(argv, folder))
    assert by_c.outcome == by_python.outcome == "error"
    assert by_c.error == by_python.error and by_c.error.startswith("cannot start ")


def _submit(spawner, argv: list[str], cwd: str) -> None:
    env = {**os.environ, "FLOWRUN_CONTROL_FD": str(native.CONTROL_FD)}
    executables = native.executables(argv[0], env)
    spawner.submit("key", argv, executables, cwd, [], env, native.devnull())


def _finished(spawner) -> list[tuple]:
    """Wait until the spawner has results, and take them."""
    select.select([spawner.fileno()], [], [], 60)
    return spawner.collect()


@needs_c
def test_the_reaper_never_takes_a_handler_the_loop_has_not_taken(tmp_path: Path) -> None:
    """A handler that exited before its loop collected it is still pending: the reaper's
    pass over dead children leaves it alone, so its caller gets its real exit status."""
    spawner = native.ext.Spawner()
    try:
        _submit(spawner, ["/bin/sh", "-c", "exit 3"], str(tmp_path))
        [(key, pid, pidfd, *reads)] = _finished(spawner)
        assert key == "key" and native.ext.is_pending(pid)
        poll(lambda: pid in _zombie_children(), what="the handler exited")
        reaper._reap([pid])  # as the reaper's sweep would for a zombie it does not know
        assert pid in _zombie_children(), "a pending handler was reaped"
        native.forget([pid])
        assert not native.ext.is_pending(pid)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 3
        for fd in (pidfd, *reads):
            os.close(fd)
    finally:
        spawner.close()


@needs_c
def test_a_closed_spawner_ends_what_nobody_took(tmp_path: Path) -> None:
    """A spawner closed with a started handler not collected (its loop closed): the
    handler's group is killed, its descriptors closed, and it is no longer pending."""
    spawner = native.ext.Spawner()
    native.devnull()  # opened once for the process's life
    before = _open_fds()
    _submit(spawner, ["/bin/sh", "-c", "echo $$ > pid; exec sleep 600"], str(tmp_path))
    select.select([spawner.fileno()], [], [], 60)
    pid = int(poll(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text()))
    spawner.close()
    assert not native.ext.is_pending(pid)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -9
    assert not _open_fds() - before


def test_flowrun_spawn_python_forces_the_python_path() -> None:
    """``FLOWRUN_SPAWN=python`` (and a missing extension) selects the Python path, and
    ``flowrun --version`` says which path runs."""
    env = {**os.environ, native.SWITCH_ENV: "python"}
    out = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--version"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "flowrun, version" in out
    assert f"exec handlers started by: Python (_posixsubprocess; {native.SWITCH_ENV}=python)" in out
    env.pop(native.SWITCH_ENV)
    out = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--version"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    built = importlib.util.find_spec("runner.handlers._spawn") is not None
    assert ("started by: C extension" in out) == built, out


@needs_c
def test_a_forked_child_starts_handlers_with_a_pool_of_its_own(tmp_path: Path) -> None:
    """The pool's threads do not survive a ``fork``: the child starts its own (its locks
    and queue reset by the extension's ``pthread_atfork`` handlers)."""
    assert asyncio.run(run(["/bin/true"], tmp_path)).outcome == "moved"  # the pool runs
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: never back into pytest
        code = 1
        try:
            code = 0 if asyncio.run(run(["/bin/true"], tmp_path)).outcome == "moved" else 1
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
