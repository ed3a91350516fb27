"""The Python spawn path (``runner.handlers.spawn`` without the C extension): CPython's
private ``_posixsubprocess.fork_exec`` called directly, with ``vfork`` and the same
arguments and errors as ``subprocess.Popen._execute_child`` (``docs/performance.md``,
"The Python spawn path"), and the started process as a :class:`Proc`.

A spawn thread keeps one lasting error pipe (:func:`thread_started`) where the spawn is
seen to wait for the child's exec; elsewhere each spawn gets a pipe of its own.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import subprocess
import threading

from runner.handlers import native
from runner.handlers.environ import encode_env
from runner.handlers.process_setup import ProcSetup

try:
    from _posixsubprocess import fork_exec as _posix_fork_exec
except ImportError:  # not POSIX CPython
    _posix_fork_exec = None  # type: ignore[assignment]

_local = threading.local()  # a spawn thread's lasting error pipe (lasting_error_pipe)
#: every spawn thread's lasting error pipe, kept for the process's life
error_pipes: list[tuple[int, int]] = []


def usable() -> bool:
    """True while this path may be used (POSIX CPython, its signature as expected)."""
    return _posix_fork_exec is not None


def give_up() -> None:
    """``_posixsubprocess.fork_exec`` refused the arguments of CPython 3.11-3.13 (a
    ``TypeError``): ``Popen`` from now on."""
    global _posix_fork_exec
    _posix_fork_exec = None  # type: ignore[assignment]


def thread_started() -> None:
    """A spawn thread starts: give it a lasting error pipe (:func:`lasting_error_pipe`)
    when the spawns wait for the child's exec."""
    if _posix_fork_exec is not None:
        _local.errpipe = lasting_error_pipe()
        if _local.errpipe is not None:
            error_pipes.append(_local.errpipe)


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


def fork_exec(
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
        raise child_error(failure, cwd, argv[0])
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


def lasting_error_pipe() -> tuple[int, int] | None:
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


def child_error(data: bytes, cwd: str, program: str) -> Exception:
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
