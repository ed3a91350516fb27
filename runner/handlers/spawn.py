"""Starting one ``exec`` handler's process, cheaply: pipes, environment, data, the spawn.

Where the C extension is built (``runner.handlers.native``), :func:`spawn` hands the
start to it and the started children come back through :func:`_collected`. Otherwise
(no compiler at install time, ``FLOWRUN_SPAWN=python``) the Python path below runs, with
the same guarantees; the control channel's descriptor number differs (3 with the
extension).

On the Python path the process is started the way ``subprocess.Popen`` starts one with
no ``preexec_fn``: CPython's ``_posixsubprocess.fork_exec`` with ``vfork`` (the new
session, ``cwd``, the descriptors and the closing of all others are done in the child
between ``vfork`` and ``exec``; ``os.posix_spawn`` refuses ``cwd``, and it holds the GIL
while it spawns). It is called directly (``fork_exec.fork_exec``), not through ``Popen``:
Popen's own Python code, re-encoding the whole environment and opening ``/dev/null`` on
every call, cost as much of the parent's CPU as the spawn itself
(``docs/performance.md``, "The Python spawn path"). Should that private function not
take the arguments it takes in CPython 3.11-3.13, ``Popen`` is used instead (why three
spawn paths: ``docs/handlers.md``). The spawn blocks its thread until the child has
exec'd, so it runs in a small pool of threads (:func:`spawn`) while the event loop goes
on; the started children reach the loop in batches, one wake-up for all those started
meanwhile. The pipes are plain descriptors: the read ends are read by the loop itself,
only when ready (``runner.handlers.exec_handler``), with no asyncio transport or stream
per process.

Instance data reaches the handler as ``runner.handlers.data`` encodes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import control_channel
from runner.handlers import exits, fork_exec, native, reaper
from runner.handlers.data import data_env, remove_data_file
from runner.handlers.environ import add_env
from runner.handlers.fork_exec import Proc
from runner.handlers.handoff import Handoff
from runner.handlers.process_setup import ProcSetup

#: Threads that run the spawns (each blocks for one fork/exec at a time): 2 x cores, as
#: the spawn ceiling of ``bench/throughput.py --case exec`` (on 2 busy cores, 0 (spawn on
#: the loop), 1 and 2 threads all measured slower than 4).
SPAWN_THREADS = 2 * (os.cpu_count() or 1)

#: spawns waiting for a spawn thread (``_start_and_hand_over`` arguments); a plain queue
#: and threads of our own: ``ThreadPoolExecutor``'s futures and conditions cost a tenth
#: of a spawn thread's time
_jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
_threads: list[threading.Thread] = []
_NATIVE_CONTROL = str(native.CONTROL_FD)
_threads_lock = threading.Lock()
_devnull: int | None = None  # /dev/null, opened once: every handler's stdin


@dataclass
class Child:
    """A started handler: its process and the parent's ends of its pipes.

    ``out``, ``err`` and ``control`` are read ends, blocking (read them only when ready;
    owned by the caller, who closes them); ``data_file`` the path of the data file, if
    one was written.
    """

    proc: Proc | subprocess.Popen[bytes]
    out: int
    err: int
    control: int
    data_file: str | None = None
    token: str = ""
    #: True when ``runner.handlers.exits`` reports the exit (else the caller polls)
    exit_watched: bool = False
    #: the exit status once reported, and who to tell (set and read on the loop only)
    exit_code: int | None = None
    on_exit: Callable[[int], None] | None = None

    def exited(self, code: int) -> None:
        """Called on the loop with the exit status (``exits.watch``)."""
        self.exit_code = code
        if self.on_exit is not None:
            self.on_exit(code)


def _start(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    token: str,
    loop: asyncio.AbstractEventLoop,
    setup: ProcSetup | None = None,
) -> Child:
    """Create the pipes, start the process and have its exit watched (blocking; runs on a
    spawn thread)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    add_env(env, {control_channel.ENV: str(ctl_w), reaper.TOKEN_ENV: token})
    try:
        with reaper.spawning():  # the reaper never takes a fresh leader for an orphan
            proc = _spawn(argv, cwd, env, out_w, err_w, ctl_w, setup)
            reaper.add_leader(proc.pid)
    except BaseException:
        for fd in (out_r, err_r, ctl_r):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, ctl_w):
            os.close(fd)
    child = Child(proc, out_r, err_r, ctl_r, token=token)
    child.exit_watched = exits.watch(proc, loop, child.exited)
    return child


def _spawn(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    out: int,
    err: int,
    ctl: int,
    setup: ProcSetup | None = None,
) -> Proc | subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, stdin ``/dev/null``, stdout ``out``, stderr
    ``err``, ``ctl`` kept open, every other descriptor closed, ``setup`` applied. Raises
    ``OSError`` (``SubprocessError`` when a limit cannot be set)."""
    global _devnull
    if fork_exec.usable() and min(out, err, ctl) > 2:
        if _devnull is None:
            _devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return fork_exec.fork_exec(argv, cwd, env, _devnull, out, err, ctl, setup)
        except TypeError:  # not the signature of CPython 3.11-3.13: Popen from now on
            fork_exec.give_up()
    ids = {}
    if setup is not None:
        ids = dict(zip(("group", "extra_groups", "user", "preexec_fn"), setup.posix(), strict=True))
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,
        pass_fds=(ctl,),
        **ids,
    )


def _orphan(child: Child) -> None:
    """A child started for an attempt that was cancelled meanwhile (a worker abort): end
    its group, close its pipes (its exit is still collected: ``exits``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, signal.SIGKILL)
    for fd in (child.out, child.err, child.control):
        os.close(fd)
    reaper.ended(child.token)


def _collected(loop: asyncio.AbstractEventLoop, results: list[tuple[Any, ...]]) -> None:
    """Spawns the C extension finished (``native.submit``), on ``loop``: each child is
    registered with the reaper and the exits, then handed to its attempt's future."""
    pids = []
    for (fut, token, program, cwd), pid, pidfd, out_r, err_r, ctl_r in results:
        if pid is None:  # pidfd is the errno, out_r the stage
            if not fut.done():
                names = {native.STAGE_CHDIR: cwd, native.STAGE_SETUP: "limits or user"}
                name = names.get(out_r, program)
                fut.set_exception(OSError(pidfd, os.strerror(pidfd), name))
            continue
        reaper.add_leader(pid)
        pids.append(pid)
        proc = Proc(pid)
        child = Child(proc, out_r, err_r, ctl_r, token=token)
        child.exit_watched = exits.watch(proc, loop, child.exited, pidfd)
        if fut.done():
            _orphan(child)
        else:
            fut.set_result(child)
    native.forget(pids)


_started = Handoff(_orphan)  # started children, handed to the loop in batches
exits.on_loop_closed(native.drop)


def _spawner() -> None:
    """A spawn thread: start handlers from ``_jobs``, for ever (a daemon thread)."""
    job = _jobs.get()
    fork_exec.thread_started()
    _start_and_hand_over(*job)
    while True:
        _start_and_hand_over(*_jobs.get())


def _start_and_hand_over(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    token: str,
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    setup: ProcSetup | None = None,
) -> None:
    """:func:`_start` on a spawn thread; its child (or error) reaches ``fut`` on ``loop``."""
    try:
        child = _start(argv, cwd, env, token, loop, setup)
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        _started.put(loop, fut, None, exc)
    else:
        _started.put(loop, fut, child, None)


async def spawn(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    data: dict[str, Any],
    setup: ProcSetup | None = None,
) -> Child:
    """Start ``argv`` in ``cwd`` as a new session with ``env`` plus the ``FLOWRUN_DATA*``,
    control and reaper variables, ``setup`` applied in the child before its ``exec``, on
    a spawn thread; returns the :class:`Child`.

    ``env`` is changed in place. Raises ``OSError`` when the program cannot be started
    (missing, not executable, data file not writable, a limit or user not settable; on
    the Python path that last one may be a ``subprocess.SubprocessError``).
    """
    extra, path = data_env(data)
    if path is not None and setup is not None and (setup.uid >= 0 or setup.gid >= 0):
        os.chown(path, setup.uid, setup.gid)  # readable by the user the handler runs as
    add_env(env, extra)
    loop = asyncio.get_running_loop()
    exits.prepare(loop)
    token = reaper.new_token()
    fut = loop.create_future()
    try:
        if native.ext is not None:
            add_env(env, {control_channel.ENV: _NATIVE_CONTROL, reaper.TOKEN_ENV: token})
            key = (fut, token, argv[0], cwd)
            native.submit(loop, key, argv, cwd, env, _collected, setup.native() if setup else None)
        else:
            if len(_threads) < SPAWN_THREADS:
                _add_thread()
            _jobs.put((argv, cwd, env, token, loop, fut, setup))
        child = await fut
    except BaseException:
        remove_data_file(path)
        reaper.ended(token)
        raise
    child.data_file = path
    return child


def _add_thread() -> None:
    """One more spawn thread (up to ``SPAWN_THREADS``), as ``ThreadPoolExecutor`` adds
    them: one a spawn until there are enough."""
    with _threads_lock:
        if len(_threads) < SPAWN_THREADS:
            name = f"flowrun-spawn_{len(_threads)}"
            thread = threading.Thread(target=_spawner, name=name, daemon=True)
            thread.start()
            _threads.append(thread)
