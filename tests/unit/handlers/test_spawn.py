"""Starting ``exec`` handlers (``runner.handlers.spawn``), handing results from threads
to the loop in batches (``runner.handlers.handoff``), and finished attempts waiting for a
batch (``runner.engine.batching``). Real processes; no timing assertions."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from runner.engine.batching import HOLD_MAX, Hold
from runner.handlers import exits, fork_exec, native, spawn
from runner.handlers.environ import Env, encode_env
from runner.handlers.handoff import Handoff
from tests.support.fault import poll
from tests.unit.handlers.test_executor import run


@pytest.fixture(params=["C", "fork_exec", "Popen"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each start test three times: through the C extension (skipped where it is not
    built), ``_posixsubprocess.fork_exec`` directly, and ``subprocess.Popen`` (the
    Python path's fallback): all must behave the same."""
    if request.param == "C":
        if native.ext is None:
            pytest.skip(f"C spawn path not in use: {native.path_in_use()}")
    else:
        monkeypatch.setattr(native, "ext", None)
    if request.param == "Popen":
        monkeypatch.setattr(fork_exec, "_posix_fork_exec", None)
    return request.param


def _start(argv: list[str], cwd: Path | str, env: dict[str, str]) -> spawn.Child:
    """One handler started as the worker starts it; the caller closes its pipes."""

    async def main() -> spawn.Child:
        return await spawn.spawn(argv, str(cwd), dict(env), {"a": 1})

    return asyncio.run(main())


def _close(child: spawn.Child) -> None:
    for fd in (child.out, child.err, child.control):
        os.close(fd)


def _exit_code(child: spawn.Child) -> int:
    """The exit status, once the exits thread has collected it."""
    poll(lambda: child.proc.returncode is not None, what="the exit collected")
    return child.proc.returncode  # type: ignore[return-value]


def test_started_in_its_own_session_in_its_folder_with_its_pipes(tmp_path: Path, way: str) -> None:
    """The handler is a session leader (its pid is its group), runs in ``cwd`` with
    /dev/null as stdin and only the control descriptor passed besides 0-2; its output
    reaches the parent's pipes and its exit status is collected."""
    script = (
        "import json, os, sys; json.dump([os.getsid(0) == os.getpid() == os.getpgid(0),"
        " os.getcwd(), sys.stdin.read(), sorted(int(f) for f in os.listdir('/proc/self/fd')),"
        " os.environ['FLOWRUN_CONTROL_FD']], sys.stdout); print('err', file=sys.stderr);"
        " sys.exit(3)"
    )
    child = _start([sys.executable, "-c", script], tmp_path, {**os.environ})
    try:
        assert _exit_code(child) == 3
        os.set_blocking(child.out, True)
        leader, cwd, stdin, fds, ctl = json.loads(os.read(child.out, 65536))
        assert leader and cwd == str(tmp_path) and stdin == ""
        assert fds[:3] == [0, 1, 2] and int(ctl) in fds and len(fds) <= 5  # + listdir's
        os.set_blocking(child.err, True)
        assert os.read(child.err, 100) == b"err\n"
    finally:
        _close(child)


def test_program_is_looked_up_on_the_handlers_path(tmp_path: Path, way: str) -> None:
    """A bare name is looked up on the ``PATH`` of the handler's environment (as
    ``subprocess`` does), not on the daemon's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "only-here"
    tool.write_text("#!/bin/sh\nexit 7\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    child = _start(["only-here"], tmp_path, {**os.environ, "PATH": str(bin_dir)})
    try:
        assert _exit_code(child) == 7
    finally:
        _close(child)


@pytest.mark.parametrize(
    ("argv", "cwd", "code", "filename"),
    [
        (["/no/such/program"], None, errno.ENOENT, "/no/such/program"),
        (["no-such-program-anywhere"], None, errno.ENOENT, "no-such-program-anywhere"),
        (["/bin/true"], "/no/such/folder", errno.ENOENT, "/no/such/folder"),
        (["./not-executable"], None, errno.EACCES, "./not-executable"),
    ],
)
def test_what_cannot_start_raises_the_childs_error(
    tmp_path: Path, way: str, argv: list[str], cwd: str | None, code: int, filename: str
) -> None:
    """A program or folder the child cannot use raises ``OSError`` with the child's errno
    and the name at fault; no process or descriptor is left behind."""
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    before = _open_fds()
    with pytest.raises(OSError) as info:
        _start(argv, cwd or tmp_path, {**os.environ})
    assert info.value.errno == code and info.value.filename == filename
    # the loop's exit set is closed by the exits thread once it sees the loop closed
    poll(lambda: not _open_fds() - before - _lasting_fds(), what="no descriptor left")


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _lasting_fds() -> set[int]:
    """Descriptors kept for the life of the process: /dev/null, each spawn thread's error
    pipe, the exits thread's epoll set."""
    fds = {fd for pair in fork_exec.error_pipes for fd in pair}
    fds |= {fd for fd in (spawn._devnull, native._devnull) if fd is not None}
    if exits._epoll is not None:
        fds.add(exits._epoll.fileno())
    return fds


async def test_a_program_that_cannot_start_is_an_attempt_error(tmp_path: Path) -> None:
    res = await run(["/bin/true"], tmp_path / "gone")
    assert res.outcome == "error" and "cannot start '/bin/true'" in res.error


def test_an_illegal_variable_name_is_refused(tmp_path: Path, way: str) -> None:
    with pytest.raises(ValueError, match="illegal environment variable name"):
        _start(["/bin/true"], tmp_path, {**os.environ, "A=B": "c"})


async def test_handoff_delivers_every_result_and_discards_the_unwanted() -> None:
    """Results put from many threads all reach their futures (exceptions too); a result
    whose future was cancelled meanwhile goes to ``discard``."""
    discarded: list[int] = []
    handoff = Handoff(discarded.append)
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(200)]
    futs[5].cancel()
    boom = ValueError("boom")

    def put(i: int) -> None:
        handoff.put(loop, futs[i], i, boom if i == 7 else None)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = await asyncio.gather(*futs, return_exceptions=True)
    assert done[7] is boom and isinstance(done[5], asyncio.CancelledError)
    assert [d for i, d in enumerate(done) if i not in (5, 7)] == [
        i for i in range(200) if i not in (5, 7)
    ]
    assert discarded == [5]


def test_hold_waits_for_a_batch_only_while_nearly_full() -> None:
    """A worker with room to spare (or nothing running) starts its cycle at once; a
    nearly full one waits, at most ``HOLD_MAX`` seconds from the first wait."""
    hold = Hold(64)
    assert hold.batch == 16
    assert hold.wait(10.0, 0) == 0.0, "nothing running: no wait"
    assert hold.wait(10.0, 48) == 0.0, "16 free slots: a batch already"
    assert hold.wait(10.0, 60) == pytest.approx(HOLD_MAX)
    assert hold.wait(10.0 + HOLD_MAX / 2, 61) == pytest.approx(HOLD_MAX / 2)
    assert hold.left(10.0 + HOLD_MAX / 2) == pytest.approx(HOLD_MAX / 2)
    assert hold.wait(10.0 + HOLD_MAX, 61) == 0.0, "waited long enough"
    assert hold.since is None and hold.left(11.0) == float("inf")
    assert hold.wait(12.0, 63) > 0 and hold.wait(12.0, 48) == 0.0, "room again: at once"
    hold.wait(13.0, 63)
    hold.reset()
    assert hold.since is None and hold.wait(13.001, 63) == pytest.approx(HOLD_MAX)
    assert Hold(1).wait(0.0, 1) > 0 and Hold(1).wait(0.0, 0) == 0.0


def test_an_env_encodes_as_the_plain_dict_it_equals() -> None:
    """An ``Env`` is encoded from its base's items encoded once plus what was added,
    whatever was changed since: the same items as the plain dict it equals."""
    base = {"PATH": "/bin", "HOME": "/root", "X": "é"}

    def same(env: Env) -> None:
        assert sorted(encode_env(env)) == sorted(encode_env(dict(env)))

    env = Env(base, {"FLOWRUN_STATE": "s"})
    same(env)
    env.add({"FLOWRUN_DATA": "{}"})
    env["FLOWRUN_RUN"] = "1.2.3"
    same(env)
    encode_env(env).clear()  # a fresh list each time: the cache is not changed
    same(env)
    env.update(HOME="/home/x")  # a base variable set again
    same(env)
    env.pop("X")  # any other change: encoded whole
    assert env.base is None and b"X=\xc3\xa9" not in encode_env(env)
    same(env)
    assert base == {"PATH": "/bin", "HOME": "/root", "X": "é"}, "the base is never changed"
    with pytest.raises(ValueError):
        encode_env(Env(base, {"A=B": "c"}))


def test_a_lasting_error_pipe_only_where_the_spawn_waits_for_the_exec() -> None:
    """CPython on Linux spawns with ``vfork``: the probe child's message is there at once,
    so a spawn thread keeps one error pipe (non-blocking read end, both close-on-exec)."""
    ends = fork_exec.lasting_error_pipe()
    assert ends is not None
    try:
        assert not os.get_blocking(ends[0]) and os.get_blocking(ends[1])
        assert not os.get_inheritable(ends[0]) and not os.get_inheritable(ends[1])
        with pytest.raises(BlockingIOError):
            os.read(ends[0], 100)  # the probe's message was read
    finally:
        os.close(ends[0])
        os.close(ends[1])


def test_exits_of_a_closed_loops_handlers_are_still_collected(tmp_path: Path) -> None:
    """A loop that closes while its handlers run (a worker that aborted) leaves their
    exits to the exits thread: each is collected (no zombie) and the loop's set closed."""

    async def main() -> tuple[spawn.Child, asyncio.AbstractEventLoop]:
        child = await spawn.spawn(
            [sys.executable, "-c", "import time; time.sleep(0.5)"], str(tmp_path), {}, {}
        )
        return child, asyncio.get_running_loop()

    child, loop = asyncio.run(main())
    try:
        assert loop in exits._sets or child.proc.returncode is not None
        assert _exit_code(child) == 0
        poll(lambda: loop not in exits._sets, what="the closed loop's set dropped")
    finally:
        _close(child)
