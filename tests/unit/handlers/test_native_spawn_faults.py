"""The C spawn path (``runner.handlers._spawn``) where a daemon can be hurt: Python code
run during a submit (``__fspath__``, a sequence's ``__len__``), a Spawner closed with
spawns queued, a ``fork`` of a process with spawns finished, descriptors running out
(``EMFILE``), the signals a handler starts with.
Real processes; the crashes a fault used to cause are run in a subprocess."""

from __future__ import annotations

import gc
import os
import select
import signal
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest

from runner.handlers import native, reaper
from tests.support.fault import poll
from tests.unit.handlers.test_native_spawn import _zombie_children

pytestmark = pytest.mark.skipif(native.ext is None, reason="C spawn path not in use")


def _take_one(spawner) -> tuple:
    """Wait for one finished spawn and take it."""
    select.select([spawner.fileno()], [], [], 60)
    [result] = spawner.collect()
    return result


def _output(result: tuple) -> bytes:
    """A started handler's stdout to its end; its process reaped, descriptors closed."""
    _key, pid, pidfd, out, err, ctl = result
    assert pid is not None, f"could not start: {os.strerror(pidfd)}"
    native.forget([pid])
    chunks = []
    while chunk := os.read(out, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    for fd in (pidfd, out, err, ctl):
        if fd >= 0:
            os.close(fd)
    return b"".join(chunks)


class _LyingList(list):
    """A list whose ``len()`` (what the submit used to size the environment by) is not
    its number of items (what it was filled from)."""

    def __init__(self, items: list, length: int) -> None:
        super().__init__(items)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return iter(list.copy(self))


@pytest.mark.parametrize("length", [0, 1], ids=["len-0", "len-1"])
def test_the_environment_is_built_from_the_items_not_from_their_len(
    tmp_path: Path, length: int
) -> None:
    """The environment's items are counted as they are read: a sequence whose ``len()``
    lies neither overwrites the items with the added variables nor is read past."""
    spawner = native.ext.Spawner()
    try:
        items = _LyingList([b"A=1", b"B=2"], length)
        argv = ["/bin/sh", "-c", 'echo "$A $B $C"']
        spawner.submit("k", argv, (b"/bin/sh",), str(tmp_path), items, {"C": "3"}, native.devnull())
        assert _output(_take_one(spawner)) == b"1 2 3\n"
        # executables from a generator: counted as read too (was a SystemError)
        execs = (p for p in [b"/no/such", b"/bin/sh"])
        spawner.submit("k", argv, execs, str(tmp_path), [b"A=x"], {}, native.devnull())
        assert _output(_take_one(spawner)) == b"x  \n"
    finally:
        spawner.close()


@pytest.mark.parametrize(
    ("argv", "execs", "cwd", "added", "message"),
    [
        ([], (b"/bin/true",), None, {}, "empty argv"),
        (["true"], (), None, {}, "no executable to try"),
        (["tr\0ue"], (b"/bin/true",), None, {}, "null"),
        (["true"], (b"/bin/tr\0ue",), None, {}, "null"),
        (["true"], (b"/bin/true",), "/t\0mp", {}, "null"),
        (["true"], (b"/bin/true",), None, {"A": "x\0y"}, "null"),
        (["true"], (b"/bin/true",), None, {"A=B": "x"}, "illegal environment variable name"),
    ],
    ids=["empty-argv", "no-executable", "nul-argv", "nul-exec", "nul-cwd", "nul-env", "eq-key"],
)
def test_what_cannot_be_passed_to_execve_is_refused_at_once(
    argv: list[str], execs: tuple, cwd: str | None, added: dict, message: str
) -> None:
    """An empty argv or list of executables (the child used to exec nothing and report
    success or a stale errno), a NUL byte anywhere, a ``=`` in a name: ``ValueError``
    from the submit, nothing queued."""
    spawner = native.ext.Spawner()
    try:
        with pytest.raises(ValueError, match=message):
            spawner.submit("k", argv, execs, cwd, [], added, native.devnull())
        assert spawner.collect() == []
    finally:
        spawner.close()


def _run_script(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_python_code_run_by_a_submit_cannot_crash_it() -> None:
    """An argument's ``__fspath__`` runs Python code in the middle of a submit: one that
    closes the Spawner (the submit used to go on with no core: a segfault), empties the
    argv list being read (read past its end) or grows the dict of added variables
    (written past the array) gets an error, never a crash, and nothing is started."""
    done = _run_script(
        """
        import os, select
        from runner.handlers import native
        spawner = native.ext.Spawner()

        class Closing:
            def __fspath__(self):
                spawner.close()
                return "/bin/true"

        try:
            spawner.submit("k", [Closing()], (b"/bin/true",), None, [], {}, native.devnull())
        except ValueError as exc:
            print("refused:", exc)
        spawner = native.ext.Spawner()
        argv = []

        class Emptying:
            def __fspath__(self):
                argv.clear()
                return "/bin/echo"

        argv.extend([Emptying(), "a", "b"])
        try:
            spawner.submit("k", argv, (b"/bin/echo",), None, [], {}, native.devnull())
        except RuntimeError as exc:
            print("refused:", exc)
        added = {}

        class Adding:
            def __fspath__(self):
                added.update({f"V{i}": "x" for i in range(100)})
                return "x"

        added["A"] = Adding()
        try:
            spawner.submit("k", ["/bin/true"], (b"/bin/true",), None, [], added, native.devnull())
        except RuntimeError as exc:
            print("refused:", exc)
        print("collected:", spawner.collect())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "refused: closed Spawner\n"
        "refused: argv changed size during submit\n"
        "refused: env_added changed size during submit\n"
        "collected: []\n"
    )


def test_closing_a_spawner_drops_its_queued_spawns_at_once(tmp_path: Path) -> None:
    """A Spawner closed with spawns still queued (its loop closed while the pool was
    busy): those are dropped at once, never started, their keys released (they used to
    be started, only to be killed); those in flight are ended by their thread."""
    native.ext.set_threads(native.THREADS)
    spawner = native.ext.Spawner()
    other = native.ext.Spawner()  # its collect() frees what the pool ended meanwhile

    class Key:
        pass

    keys = [Key() for _ in range(30)]
    refs = [weakref.ref(k) for k in keys]
    native.ext.hold_reaps(True)  # the pool's threads each take one and wait
    try:
        for key in keys:
            argv, cwd = ["/bin/true"], str(tmp_path)
            spawner.submit(key, argv, (b"/bin/true",), cwd, [], {}, native.devnull())
        del keys, key
        spawner.close()
        gc.collect()
        dropped = sum(ref() is None for ref in refs)
    finally:
        native.ext.hold_reaps(False)
    assert dropped >= len(refs) - native.THREADS
    poll(lambda: (other.collect(), all(ref() is None for ref in refs))[1], what="in flight ended")
    poll(lambda: (reaper._reap(_zombie_children()), not _zombie_children())[1], what="reaped")
    other.close()


def test_a_forked_child_leaves_the_parents_handlers_alone(tmp_path: Path) -> None:
    """A child forked while a spawn is finished and not yet collected inherits the
    Spawner: closing it there (its loop's end, its exit) must not kill the parent's
    handler (it used to: the same pid, the same group) nor touch the pool's locks."""
    spawner = native.ext.Spawner()
    try:
        argv = ["/bin/sh", "-c", "exec sleep 600"]
        spawner.submit("k", argv, (b"/bin/sh",), str(tmp_path), [], {}, native.devnull())
        select.select([spawner.fileno()], [], [], 60)
        child = os.fork()
        if child == 0:  # pragma: no cover - the forked child: never back into pytest
            code = 1
            try:
                code = 0 if spawner.collect() == [] else 2
                spawner.close()
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        [(_key, pid, pidfd, *reads)] = spawner.collect()
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the parent's handler was killed"
        native.forget([pid])
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        for fd in (pidfd, *reads):
            os.close(fd)
    finally:
        spawner.close()


def test_running_out_of_descriptors_leaves_none_open_and_no_child() -> None:
    """``EMFILE`` at each step of a spawn (each pipe, the lifting of a write end above 3,
    the pidfd: a busy daemon near its ``RLIMIT_NOFILE``): the spawn fails with
    ``EMFILE`` (or starts without a pidfd), and no descriptor nor child is left behind."""
    done = _run_script(
        """
        import errno, os, resource, select
        from runner.handlers import native
        spawner = native.ext.Spawner()
        stdin = native.devnull()
        fds = lambda: set(map(int, os.listdir("/proc/self/fd")))
        before = fds()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        seen = set()
        for extra in range(9):
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(before) + 1 + extra, hard))
            spawner.submit("k", ["/bin/true"], (b"/bin/true",), None, [], {}, stdin)
            select.select([spawner.fileno()], [], [], 60)
            [(key, pid, pidfd, *reads)] = spawner.collect()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            if pid is None:
                assert pidfd == errno.EMFILE, os.strerror(pidfd)
                seen.add("EMFILE")
            else:
                native.forget([pid])
                os.waitpid(pid, 0)
                seen.add("no pidfd" if pidfd < 0 else "pidfd")
                for fd in (pidfd, *reads):
                    if fd >= 0:
                        os.close(fd)
            assert fds() == before, (extra, fds() - before)
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            print(sorted(seen))
        """
    )
    assert done.returncode == 0, done.stderr
    seen = done.stdout.strip()
    assert "'EMFILE'" in seen and "'pidfd'" in seen, seen  # (the pidfd is opened after the
    # write ends are closed: three descriptors free, "no pidfd" is not seen here)


def test_a_handler_starts_with_no_signal_blocked_or_ignored_by_python(tmp_path: Path) -> None:
    """The handler's signal mask is empty, and ``SIGPIPE``/``SIGXFSZ`` (ignored by
    Python) are back to their defaults, as ``Popen`` leaves them; the daemon's handler
    for ``SIGUSR1`` does not follow it."""
    spawner = native.ext.Spawner()
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        argv = ["/bin/cat", "/proc/self/status"]
        spawner.submit("k", argv, (b"/bin/cat",), str(tmp_path), [], {}, native.devnull())
        status = _output(_take_one(spawner)).decode()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        spawner.close()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert int(fields["SigBlk"], 16) == 0
    ignored = int(fields["SigIgn"], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))
    assert int(fields["SigCgt"], 16) == 0
