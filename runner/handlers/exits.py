"""Handler exits, watched by one thread for every ``exec`` handler of the process.

Each handler's pidfd (Linux ≥ 5.3, ``os.pidfd_open``) goes into one ``epoll`` set, from
the spawn thread that started it; a thread waits on that set, collects each exit status
at once (``poll()`` of its ``spawn.Proc`` or ``Popen``: no zombie is left, and the leader
is no longer counted by ``runner.handlers.reaper``) and hands a whole batch of exits to
the event loop with one wake-up. The loop itself makes no system call per handler for its
exit. (A pidfd watches the handler alone: its output pipes may stay open in a child it
left behind.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections.abc import Callable
from typing import Any

from runner.handlers import reaper

#: ``pidfd -> (process, loop, callback(returncode))`` of handlers still running.
_waiting: dict[int, tuple[Any, asyncio.AbstractEventLoop, Callable]] = {}
_lock = threading.Lock()
_epoll: select.epoll | None = None


def watch(proc: Any, loop: asyncio.AbstractEventLoop, callback: Callable[[int], None]) -> bool:
    """Call ``callback(returncode)`` on ``loop`` once ``proc`` exits (thread-safe);
    ``proc`` has ``pid``, ``poll()`` and ``wait()`` (``spawn.Proc``, ``subprocess.Popen``).

    False when pidfds are not available (not Linux ≥ 5.3): the caller polls instead.
    """
    global _epoll
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return False
    with _lock:
        if _epoll is None:
            _epoll = select.epoll()
            threading.Thread(target=_run, args=(_epoll,), name="flowrun-exits", daemon=True).start()
        _waiting[pidfd] = (proc, loop, callback)
    _epoll.register(pidfd, select.EPOLLIN)
    return True


def _run(ep: select.epoll) -> None:
    while True:
        try:
            events = ep.poll()
        except InterruptedError:
            continue
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for fd, _ in events:
            with _lock:
                entry = _waiting.pop(fd, None)
            # unregistered before it is closed: a child between its vfork and its exec
            # still holds the pidfd, and a closed fd would stay in the set until then
            with contextlib.suppress(OSError):
                ep.unregister(fd)
            os.close(fd)
            if entry is None:
                continue
            proc, loop, callback = entry
            code = proc.poll()
            if code is None:  # a readable pidfd means it exited; never seen, but be safe
                code = proc.wait()
            reaper.leader_reaped(proc.pid)
            batches.setdefault(loop, []).append((callback, code))
        for loop, batch in batches.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed (worker aborted)
                loop.call_soon_threadsafe(_deliver, batch)


def _deliver(batch: list) -> None:
    for callback, code in batch:
        callback(code)
