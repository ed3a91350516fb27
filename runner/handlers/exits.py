"""Handler exits, watched by the event loop that runs the handlers, with no thread between.

Each handler's pidfd (Linux ≥ 5.3, ``os.pidfd_open``) goes, from the spawn thread that
started it, into an ``epoll`` set of its loop's own (:class:`_ExitSet`); that set's
descriptor is one reader of the loop's selector (an epoll set is itself pollable), so an
exit wakes the loop directly: it collects the exit status at once (``poll()`` of the
``fork_exec.Proc`` or ``Popen``: no zombie is left, and the leader is no longer counted by
``runner.handlers.reaper``) and calls the handler's callback. No thread hands exits over
through ``call_soon_threadsafe``: that would cost two more thread wake-ups and GIL
hand-overs an attempt, about 35 µs of CPU (``docs/performance.md``, "Exits on the loop's
own epoll set").

A loop that closes while some of its handlers still run (a worker that aborted, a test's
``asyncio.run``) is found by a thread (:data:`ADOPT_EVERY` seconds) that then watches its
set in its place and collects those exits without calling back. The same thread watches
the pidfds of callers with no set (:func:`watch` outside :func:`prepare`'s loops).
(A pidfd watches the handler alone: its output pipes may stay open in a child it left
behind.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from runner.handlers import reaper

if TYPE_CHECKING:
    from subprocess import Popen

    from runner.handlers.fork_exec import Proc

#: A started handler process (``runner.handlers.spawn``'s ``Child.proc``).
Process: TypeAlias = "Proc | Popen[bytes]"

#: Seconds between two looks for closed loops whose handlers still run.
ADOPT_EVERY = 0.25
#: A pidfd is reported once, then never again, so it is closed without unregistering it
#: (one system call less): a child between its vfork and its exec may still hold a copy
#: of it, which keeps it in the set (with ``EPOLLIN`` alone it would be reported again
#: under a number that may be the next handler's pidfd) until that exec.
_ONCE = select.EPOLLIN | select.EPOLLONESHOT

_lock = threading.Lock()
#: the exit set of each loop that starts handlers (until it closes)
_sets: dict[asyncio.AbstractEventLoop, _ExitSet] = {}
#: ``pidfd -> (process, loop, callback)`` watched by the thread itself (no loop set)
_waiting: dict[int, tuple[Process, asyncio.AbstractEventLoop, Callable[[int], None]]] = {}
#: ``epoll fd -> set`` of closed loops, watched by the thread
_adopted: dict[int, _ExitSet] = {}
_epoll: select.epoll | None = None  # the thread's
#: called (on the thread) with each loop found closed: ``on_loop_closed``
_closers: list[Callable[[asyncio.AbstractEventLoop], None]] = []


class _ExitSet:
    """The pidfds of one loop's running handlers, in an epoll set the loop reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ep = select.epoll()
        self.closed = False  # set (under ``_lock``) once the thread dropped it
        self.waiting: dict[int, tuple[Process, Callable[[int], None]]] = {}
        #: pipes read as data comes (:func:`watch_pipe`): ``fd -> callback(fd, events)``
        self.pipes: dict[int, Callable[[int, int], object]] = {}
        loop.add_reader(self.ep.fileno(), self.collect)

    def add(self, pidfd: int, proc: Process, callback: Callable[[int], None]) -> bool:
        """Watch ``pidfd`` (thread-safe); False if this set is closed."""
        with _lock:
            if self.closed:
                return False
            self.waiting[pidfd] = (proc, callback)
            self.ep.register(pidfd, _ONCE)
        return True

    def collect(self, deliver: bool = True) -> None:
        """Collect every exit that is ready; call back unless ``deliver`` is False (the
        loop is closed: the thread collects)."""
        try:
            events = self.ep.poll(0)
        except InterruptedError:
            return
        for fd, event in events:
            reader = self.pipes.get(fd)
            if reader is not None:
                if deliver:
                    reader(fd, event)
                else:  # its loop is gone: nobody reads it any more
                    del self.pipes[fd]
                    with contextlib.suppress(OSError):
                        self.ep.unregister(fd)
                continue
            with _lock:
                entry = self.waiting.pop(fd, None)
            if entry is None:  # a pipe unwatched by a callback of this same batch
                continue  # (``unwatch_pipe``): not ours to close
            os.close(fd)
            code = _reap(entry[0])
            if deliver:
                entry[1](code)


def prepare(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` (the running loop: call on it) its exit set, once."""
    if loop not in _sets:
        with _lock:
            _sets[loop] = _ExitSet(loop)
        _thread_epoll()


def on_loop_closed(closer: Callable[[asyncio.AbstractEventLoop], None]) -> None:
    """Have ``closer(loop)`` called (on this module's thread, within :data:`ADOPT_EVERY`
    seconds) for every loop given to :func:`prepare` that closes; it must not raise."""
    _closers.append(closer)


def watch(
    proc: Process,
    loop: asyncio.AbstractEventLoop,
    callback: Callable[[int], None],
    pidfd: int | None = None,
) -> bool:
    """Call ``callback(returncode)`` on ``loop`` once ``proc`` exits (thread-safe);
    ``proc`` has ``pid``, ``poll()`` and ``wait()`` (``fork_exec.Proc``, ``subprocess.Popen``).
    ``pidfd``: its pidfd, already open (``runner.handlers._spawn``; -1: none), else it is
    opened here; this module closes it.

    False when pidfds are not available (not Linux ≥ 5.3): the caller polls instead.
    """
    if pidfd is None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            return False
    elif pidfd < 0:
        return False
    exit_set = _sets.get(loop)
    if exit_set is not None and exit_set.add(pidfd, proc, callback):
        return True
    ep = _thread_epoll()
    with _lock:
        _waiting[pidfd] = (proc, loop, callback)
    ep.register(pidfd, _ONCE)
    return True


def watch_pipe(
    loop: asyncio.AbstractEventLoop, fd: int, callback: Callable[[int, int], object]
) -> bool:
    """Call ``callback(fd, events)`` on ``loop`` (the running loop: call on it) whenever the
    pipe ``fd`` is readable or its writers are gone (``events``: the epoll mask; without
    ``EPOLLIN`` there is nothing to read), through ``loop``'s exit set: one ``epoll_ctl``,
    about a tenth of ``loop.add_reader`` with its ``remove_reader``. False when ``loop``
    has no exit set (:func:`prepare`): use ``add_reader`` then. :func:`unwatch_pipe`
    before closing ``fd``."""
    exit_set = _sets.get(loop)
    if exit_set is None or exit_set.closed:
        return False
    exit_set.pipes[fd] = callback
    exit_set.ep.register(fd, select.EPOLLIN)
    return True


def unwatch_pipe(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Stop calling back for ``fd`` (given to :func:`watch_pipe`; on ``loop``)."""
    exit_set = _sets.get(loop)
    if exit_set is not None and exit_set.pipes.pop(fd, None) is not None:
        try:
            exit_set.ep.unregister(fd)
        except OSError:  # the set was closed
            pass


def _reap(proc: Process) -> int:
    """The exit status of ``proc``, whose pidfd said it exited; no longer a leader."""
    code = proc.poll()
    if code is None:  # a readable pidfd means it exited; never seen, but be safe
        code = proc.wait()
    reaper.leader_reaped(proc.pid)
    return code


def _thread_epoll() -> select.epoll:
    """The thread's epoll set; the thread is started with it."""
    global _epoll
    with _lock:
        if _epoll is None:
            _epoll = select.epoll()
            threading.Thread(target=_run, args=(_epoll,), name="flowrun-exits", daemon=True).start()
        return _epoll


def _run(ep: select.epoll) -> None:
    while True:
        try:
            events = ep.poll(ADOPT_EVERY)
        except InterruptedError:
            continue
        batches: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for fd, _ in events:
            adopted = _adopted.get(fd)
            if adopted is not None:
                adopted.collect(deliver=False)
                continue
            with _lock:
                entry = _waiting.pop(fd, None)
            os.close(fd)
            if entry is not None:
                proc, loop, callback = entry
                batches.setdefault(loop, []).append((callback, _reap(proc)))
        for loop, batch in batches.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed (worker aborted)
                loop.call_soon_threadsafe(_deliver, batch)
        _adopt(ep)


def _adopt(ep: select.epoll) -> None:
    """Watch the sets of loops that closed; drop those with nothing left to collect."""
    for loop, exit_set in list(_sets.items()):
        if loop.is_closed():
            with _lock:
                del _sets[loop]
            for closer in _closers:
                closer(loop)
            _adopted[exit_set.ep.fileno()] = exit_set
            ep.register(exit_set.ep.fileno(), select.EPOLLIN)
            exit_set.collect(deliver=False)  # exits that came before it was adopted
    for fd, exit_set in list(_adopted.items()):
        with _lock:
            if exit_set.waiting:
                continue
            exit_set.closed = True
        del _adopted[fd]
        with contextlib.suppress(OSError):
            ep.unregister(fd)
        exit_set.ep.close()


def _deliver(batch: list[Any]) -> None:
    for callback, code in batch:
        callback(code)
