"""Starting one ``exec`` handler's process, cheaply: pipes, environment, data, the spawn.

The process is started by ``subprocess.Popen`` with no ``preexec_fn``, so CPython 3.11
takes its ``vfork`` path (``start_new_session``, ``cwd`` and ``pass_fds`` are done in the
child between ``vfork`` and ``exec``; ``posix_spawn`` would refuse ``cwd`` and
``start_new_session``). The spawn blocks its thread until the child has exec'd, so it runs
in a small pool of threads (:func:`spawn`) while the event loop goes on committing and
reading other handlers' pipes. The pipes are plain descriptors: the read ends are
non-blocking and read by the loop itself (``runner.handlers.exec_handler``), with no
asyncio transport or stream per process.

Instance data reaches the handler in ``FLOWRUN_DATA`` while its JSON is at most
:data:`DATA_INLINE_MAX` bytes. Larger data (an environment string is capped at 128 kB by
Linux, and all of them together at a quarter of the stack limit) goes to a private file
named by ``FLOWRUN_DATA_FILE`` instead, removed when the attempt ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from runner import control
from runner.handlers import exits, reaper

#: Largest JSON (bytes) passed inline in ``FLOWRUN_DATA``; larger goes to a file.
DATA_INLINE_MAX = 64 * 1024
DATA_ENV = "FLOWRUN_DATA"
DATA_FILE_ENV = "FLOWRUN_DATA_FILE"

#: Threads that run the spawns (each blocks for one fork/exec at a time): 2 x cores, as
#: the spawn ceiling of ``bench/throughput.py --case exec`` (on 2 busy cores, 0 (spawn on
#: the loop), 1 and 2 threads all measured slower than 4).
SPAWN_THREADS = 2 * (os.cpu_count() or 1)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


@dataclass
class Child:
    """A started handler: its process and the parent's ends of its pipes.

    ``out``, ``err`` and ``control`` are non-blocking read ends (owned by the caller, who
    closes them); ``data_file`` the path of the data file, if one was written.
    """

    proc: subprocess.Popen
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


def data_env(data: dict) -> tuple[dict[str, str], str | None]:
    """``({FLOWRUN_DATA: json} or {FLOWRUN_DATA_FILE: path}, path or None)``.

    Large data is written to a file readable by the owner only, in the system's temporary
    folder; the caller removes it (:func:`remove_data_file`). Raises ``OSError`` if the
    file cannot be written.
    """
    text = json.dumps(data, separators=(",", ":"))
    if len(text) <= DATA_INLINE_MAX:  # characters ≤ bytes: the file path is rarely taken
        return {DATA_ENV: text}, None
    fd, path = tempfile.mkstemp(prefix="flowrun-data-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except BaseException:
        remove_data_file(path)
        raise
    return {DATA_FILE_ENV: path}, path


def remove_data_file(path: str | None) -> None:
    """Remove a data file written by :func:`data_env` (a missing file is fine)."""
    if path:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _start(
    argv: list[str], cwd: str, env: dict[str, str], token: str, loop: asyncio.AbstractEventLoop
) -> Child:
    """Create the pipes, start the process and have its exit watched (blocking; runs on a
    spawn thread)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    env[control.ENV] = str(ctl_w)
    env[reaper.TOKEN_ENV] = token
    try:
        with reaper.spawning():  # the reaper never takes a fresh leader for an orphan
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
                pass_fds=(ctl_w,),
            )
            reaper.add_leader(proc.pid)
    except BaseException:
        for fd in (out_r, err_r, ctl_r):
            os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, ctl_w):
            os.close(fd)
    for fd in (out_r, err_r, ctl_r):
        os.set_blocking(fd, False)
    child = Child(proc, out_r, err_r, ctl_r, token=token)
    child.exit_watched = exits.watch(proc, loop, child.exited)
    return child


async def spawn(argv: list[str], cwd: str, env: dict[str, str], data: dict) -> Child:
    """Start ``argv`` in ``cwd`` as a new session with ``env`` plus the ``FLOWRUN_DATA*``,
    control and reaper variables, on a spawn thread; returns the :class:`Child`.

    ``env`` is changed in place. Raises ``OSError`` when the program cannot be started
    (missing, not executable, data file not writable).
    """
    global _pool
    extra, path = data_env(data)
    env.update(extra)
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(SPAWN_THREADS, thread_name_prefix="flowrun-spawn")
    loop = asyncio.get_running_loop()
    try:
        child = await loop.run_in_executor(_pool, _start, argv, cwd, env, reaper.new_token(), loop)
    except BaseException:
        remove_data_file(path)
        raise
    child.data_file = path
    return child
