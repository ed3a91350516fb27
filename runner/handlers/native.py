"""Starting handlers through the C extension ``runner.handlers._spawn``, when it is built.

The extension does, without the GIL and on a pool of POSIX threads of its own, what
``runner.handlers.spawn`` otherwise does in Python around ``_posixsubprocess.fork_exec``
on spawn threads: three pipes, a ``vfork`` child (new session, ``cwd``, stdin
``/dev/null``, stdout and stderr to the pipes, the control channel as descriptor 3, every
other descriptor closed, ``SIGPIPE``/``SIGXFSZ`` back to their defaults), an exec failure
reported as an errno through the memory a ``vfork`` child shares with its parent (no
error pipe), and the child's pidfd. Each event loop has a ``_spawn.Spawner``: the loop
submits spawns without waiting (:func:`submit`) and collects the finished ones in
batches when the spawner's eventfd is readable. 70-90 µs less of the daemon's CPU an
attempt than the Python path, and a third of its context switches (``docs/performance.md``,
"The C spawn extension"; why three spawn paths: ``docs/handlers.md``).

The extension is optional (``setup.py``: a machine without a C compiler installs flowrun
without it). :func:`path_in_use` says which path runs (``flowrun --version`` prints it);
``FLOWRUN_SPAWN=python`` in the daemon's environment forces the Python path.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from runner.handlers.environ import encode_parts

if TYPE_CHECKING:
    from runner.handlers._spawn import Spawner

#: ``FLOWRUN_SPAWN``: ``python`` forces the Python path even where the extension is built
SWITCH_ENV = "FLOWRUN_SPAWN"


def _load() -> ModuleType | None:
    if os.environ.get(SWITCH_ENV, "").strip().lower() == "python":
        return None
    try:
        from runner.handlers import _spawn
    except ImportError:  # not built (no compiler at install time) or not Linux
        return None
    return _spawn


#: the extension module, or None (the Python path): tests set it to None to run both
ext: ModuleType | None = _load()
#: the control channel's descriptor in a handler started by the extension
CONTROL_FD = 3
#: a child's failure was at its ``chdir`` (``submit``'s ``stage``)
STAGE_CHDIR = 1
#: ... at its set-up: limits, niceness, user or group (``ProcSetup``)
STAGE_SETUP = 4
#: the extension's threads (each blocks for one vfork at a time): 2 x cores, as the
#: Python path's spawn threads and the spawn ceiling of ``bench/throughput.py``
THREADS = int(os.environ.get("FLOWRUN_SPAWN_THREADS", 0)) or 2 * (os.cpu_count() or 1)
_devnull: int | None = None  # /dev/null, opened once (4 or above: 0-3 are the child's)
_spawners: dict[asyncio.AbstractEventLoop, Spawner] = {}  # each loop's ``_spawn.Spawner``


def path_in_use() -> str:
    """``"C extension"`` or ``"Python (_posixsubprocess)"`` and why, for ``--version``
    and the worker's start-up log line."""
    if ext is not None:
        return "C extension (runner.handlers._spawn)"
    if os.environ.get(SWITCH_ENV, "").strip().lower() == "python":
        return f"Python (_posixsubprocess; {SWITCH_ENV}=python)"
    return "Python (_posixsubprocess; the C extension is not built)"


def executables(program: str, env: dict[str, str]) -> tuple[bytes, ...]:
    """Where to look for ``program``, as ``subprocess`` does (``os._execvpe``): itself
    when it names a folder, else each folder of the ``PATH`` of ``env`` (the handler's
    environment, not the daemon's)."""
    executable = os.fsencode(program)
    if os.path.dirname(executable):
        return (executable,)
    return tuple(os.path.join(os.fsencode(d), executable) for d in os.get_exec_path(env))


def devnull() -> int:
    """``/dev/null`` opened once for reading (close-on-exec, descriptor 4 or above)."""
    global _devnull
    if _devnull is None:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if fd < 4:  # the daemon runs with some of 0-2 closed
            low, fd = fd, fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 4)
            os.close(low)
        _devnull = fd
    return _devnull


def submit(
    loop: asyncio.AbstractEventLoop,
    key: object,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    deliver: Callable[[asyncio.AbstractEventLoop, list[tuple[Any, ...]]], None],
    setup: tuple[tuple[tuple[int, int, int], ...], int, int, int] | None = None,
) -> None:
    """Start ``argv`` in ``cwd`` with ``env`` (which must already name :data:`CONTROL_FD`)
    on the extension's threads; returns at once. ``deliver(loop, results)`` is later
    called on ``loop`` with the spawns finished meanwhile, oldest first: ``(key, pid,
    pidfd or -1, stdout, stderr, control)`` (read ends, blocking, close-on-exec, owned by
    the callee, who must call :func:`forget` once the pids are registered with the
    reaper) or ``(key, None, errno, stage, 0, 0)`` when the child could not start
    (``stage`` :data:`STAGE_CHDIR`: the folder, :data:`STAGE_SETUP`: its limits or user,
    else the program; the child was reaped, nothing is left open). ``setup``:
    ``ProcSetup.native()``, applied in the child before its ``exec``. Raises
    ``ValueError`` (a variable name with ``=``, a NUL byte, a bad ``setup``) at once.
    ``deliver`` is the same for every call on one loop (the first one is kept).
    """
    spawner = _spawners.get(loop)
    if spawner is None:
        spawner = _new_spawner(loop, deliver)
    items, added = encode_parts(env)
    spawner.submit(key, argv, executables(argv[0], env), cwd, items, added, devnull(), setup)


def drop(loop: asyncio.AbstractEventLoop) -> None:
    """``loop`` closed: close its spawner (what it started and nobody took is killed,
    its descriptors closed). Thread-safe."""
    spawner = _spawners.pop(loop, None)
    if spawner is not None:
        spawner.close()


def forget(pids: list[int]) -> None:
    """The reaper knows these handlers now (``reaper.add_leader``): see :func:`submit`."""
    ext.forget(pids)  # type: ignore[union-attr]


def _new_spawner(
    loop: asyncio.AbstractEventLoop,
    deliver: Callable[[asyncio.AbstractEventLoop, list[tuple[Any, ...]]], None],
) -> Spawner:
    """``loop``'s spawner, its eventfd read by ``loop`` (closed by :func:`drop`)."""
    ext.set_threads(THREADS)  # type: ignore[union-attr]
    spawner = ext.Spawner()  # type: ignore[union-attr]
    loop.add_reader(spawner.fileno(), lambda: deliver(loop, spawner.collect()))
    _spawners[loop] = spawner
    return spawner
