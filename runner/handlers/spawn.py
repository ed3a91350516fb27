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
while it spawns). It is called directly (:func:`_fork_exec`), not through ``Popen``:
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
import builtins
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
from runner.handlers import exits, native, reaper
from runner.handlers.data import data_env, remove_data_file
from runner.handlers.environ import add_env, encode_env
from runner.handlers.handoff import Handoff
from runner.handlers.process_setup import ProcSetup

try:
    from _posixsubprocess import fork_exec as _posix_fork_exec
except ImportError:  # not POSIX CPython
    _posix_fork_exec = None  # type: ignore[assignment]

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
_local = threading.local()  # a spawn thread's lasting error pipe (_lasting_error_pipe)
_error_pipes: list[tuple[int, int]] = []  # every spawn thread's, kept for the process's life


class Proc:
    """A started handler process: ``pid`` and, once collected, ``returncode`` (as
    ``Popen.returncode``: the exit status, or ``-signal``)."""

    __slots__ = ("pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Collect the exit status if the process has exited; ``returncode``."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # collected elsewhere: never expected
                self.returncode = 255
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        """Wait for the process to exit; ``returncode``."""
        while (code := self.poll()) is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.returncode = 255
            else:
                self.returncode = os.waitstatus_to_exitcode(status)
        return code


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
    global _posix_fork_exec, _devnull
    if _posix_fork_exec is not None and min(out, err, ctl) > 2:
        if _devnull is None:
            _devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _fork_exec(argv, cwd, env, _devnull, out, err, ctl, setup)
        except TypeError:  # not the signature of CPython 3.11-3.13: Popen from now on
            _posix_fork_exec = None  # type: ignore[assignment]
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


def _fork_exec(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    stdin: int,
    out: int,
    err: int,
    ctl: int,
    setup: ProcSetup | None = None,
) -> Proc:
    """``subprocess.Popen._execute_child`` without its overheads (same arguments to
    ``_posixsubprocess.fork_exec``, same errors: ``OSError`` with the child's errno when
    ``cwd`` or the program cannot be used). With a ``setup`` the child is a ``fork``
    (``_posixsubprocess`` uses no ``vfork`` with a user, group or ``preexec_fn``), so its
    error comes through a pipe of its own."""
    executables = native.executables(argv[0], env)  # the PATH of the handler's environment
    lasting = getattr(_local, "errpipe", None) if setup is None else None
    if lasting is not None:  # vfork: the child has exec'd or failed when this returns
        pid = _call_fork_exec(argv, executables, cwd, env, stdin, out, err, ctl, *lasting)
        try:
            failure = os.read(lasting[0], 50000)
        except BlockingIOError:  # nothing: it exec'd
            failure = b""
    else:
        errpipe_read, errpipe_write = os.pipe()
        try:
            try:
                pid = _call_fork_exec(
                    argv,
                    executables,
                    cwd,
                    env,
                    stdin,
                    out,
                    err,
                    ctl,
                    errpipe_read,
                    errpipe_write,
                    setup,
                )
            finally:
                os.close(errpipe_write)
            failure = os.read(errpipe_read, 50000)  # EOF at the exec; else why it failed
        finally:
            os.close(errpipe_read)
    if failure:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        raise _child_error(failure, cwd, argv[0])
    return Proc(pid)


def _call_fork_exec(
    argv: list[str],
    executables: tuple[bytes, ...],
    cwd: str,
    env: dict[str, str],
    stdin: int,
    out: int,
    err: int,
    ctl: int,
    errpipe_read: int,
    errpipe_write: int,
    setup: ProcSetup | None = None,
) -> int:
    gid, groups, uid, preexec = setup.posix() if setup is not None else (None,) * 4
    return _posix_fork_exec(
        argv, executables, True, tuple(sorted((ctl, errpipe_write))), cwd, encode_env(env),
        stdin, -1, -1, out, -1, err, errpipe_read, errpipe_write,
        True, True, -1, gid, groups, uid, -1, preexec, True,
    )  # fmt: skip


def _lasting_error_pipe() -> tuple[int, int] | None:
    """An error pipe for every spawn of the calling thread: ``(read end, non-blocking;
    write end)``, both close-on-exec; ``None`` unless the spawn is seen to wait for the
    child's exec (``vfork``).

    With ``vfork`` the parent resumes only once the child has exec'd or, having failed,
    written why and exited: a non-blocking read right after the spawn then finds the
    whole message or nothing, and no pipe per spawn is needed (three system calls fewer
    an attempt). A probe child that cannot exec (``/`` is a folder) checks it: its
    message must be there at once, else (a ``fork``, which does not wait) ``None``.
    """
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        pid = _posix_fork_exec(  # typeshed says str and a callable; CPython takes None
            [b"/"], (b"/",), True, (write_end,), None, [],  # type: ignore[arg-type]
            -1, -1, -1, -1, -1, -1, read_end, write_end,
            True, False, -1, None, None, None, -1, None, True,  # type: ignore[arg-type]
        )  # fmt: skip
    except (TypeError, OSError):
        told = b""
    else:
        try:
            told = os.read(read_end, 50000)
        except BlockingIOError:
            told = b""
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if told:
        return read_end, write_end
    os.close(read_end)
    os.close(write_end)
    return None


def _child_error(data: bytes, cwd: str, program: str) -> Exception:
    """The exception a child reported on the error pipe (``_posixsubprocess``'s format,
    ``ExceptionName:hex errno:message``, read as ``subprocess`` reads it)."""
    try:
        name, hex_errno, raw = data.split(b":", 2)
        message = raw.decode()
    except ValueError:
        return subprocess.SubprocessError(f"bad exception data from child: {data!r}")
    kind = getattr(builtins, name.decode("ascii", "replace"), subprocess.SubprocessError)
    if not (isinstance(kind, type) and issubclass(kind, Exception)):
        kind = subprocess.SubprocessError
    if issubclass(kind, OSError) and hex_errno:
        errno = int(hex_errno, 16)
        if message == "noexec":  # it failed before its exec: as Popen says, at the chdir
            message, filename = "", cwd
        else:
            filename = program
        return kind(errno, os.strerror(errno) if errno else message, filename)
    return kind(message)


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
    if _posix_fork_exec is not None:
        _local.errpipe = _lasting_error_pipe()
        if _local.errpipe is not None:
            _error_pipes.append(_local.errpipe)
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
