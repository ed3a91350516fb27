"""Ending what ``exec`` handlers leave behind, even outside their process group.

A handler runs in a session of its own, and the end of its attempt ends that process group
(``runner.handlers.exec_handler``). A descendant that leaves the group — ``setsid cmd &``,
a double fork, a daemon — used to escape. While a worker runs (:func:`start` …
:func:`stop`), this process is a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``,
no privileges needed; the idea of systemd's and tini's ``-s``): a descendant whose parent
dies is re-parented to us rather than to init, so every escapee ends up as our child.

Every handler is started with :data:`TOKEN_ENV` naming its attempt
(``<daemon pid>.<daemon start time>.<n>``); descendants inherit it. A thread looks at
this process's children every :data:`EVERY` seconds: a child that is not a running
handler and carries the token of an attempt that has ended gets SIGTERM, then SIGKILL
after the grace; dead ones (zombies) are reaped. While no attempt runs and this process
has no child, nothing can appear to end or reap (a handler's escaped descendants are
re-parented to us before its exit status can be collected), so the thread sleeps until
the next attempt starts (:func:`new_token`). So an escapee is ended within a fraction
of a second of its attempt's end (once its parent is gone: the group kill sees to that).
A descendant that clears its whole environment cannot be told apart and is only reaped.

A daemon killed with SIGKILL cannot end anything; the next worker started on this host
(:func:`start`) ends every process whose token names a daemon that no longer runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import signal
import threading
import time

from runner.handlers import native

log = logging.getLogger("flowrun.reaper")

TOKEN_ENV = "FLOWRUN_RUN"
PR_SET_CHILD_SUBREAPER = 36
#: Seconds between two looks at this process's children.
EVERY = 0.1
#: Seconds between two looks while no attempt runs and nothing is left to end or reap
#: (a safety net: the next attempt wakes the thread at once).
IDLE_EVERY = 10.0
#: Seconds between SIGTERM and SIGKILL for an escaped descendant.
GRACE = 2.0

#: Pids of running handler processes (each also its process group id).
leaders: set[int] = set()
_running: set[str] = set()  # tokens of attempts not yet ended
_seq = itertools.count(1)
_lock = threading.Lock()  # start/stop
_users = 0
_thread: threading.Thread | None = None
_stop = threading.Event()
_busy = threading.Event()  # set when an attempt starts: wakes an idle watch
_spawn_locks: list[threading.Lock] = []
_local = threading.local()
_signalled: dict[int, float] = {}  # adopted pid -> when to SIGKILL it


def _start_ticks(pid: int | str) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks): with the pid, a
    process identity that survives pid reuse; ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()


_prefix = f"{os.getpid()}.{_start_ticks('self') or 0}."


def new_token() -> str:
    """A token for one attempt, marked running until :func:`ended`."""
    token = f"{_prefix}{next(_seq)}"
    _running.add(token)
    if not _busy.is_set():
        _busy.set()
    return token


def ended(token: str) -> None:
    """The attempt of ``token`` is over: what it left behind may be ended."""
    _running.discard(token)


def add_leader(pid: int) -> None:
    """A handler process was started (call inside :func:`spawning`)."""
    leaders.add(pid)


def leader_reaped(pid: int) -> None:
    """The handler process ``pid`` exited and its status was collected."""
    leaders.discard(pid)


def spawning() -> threading.Lock:
    """The calling thread's spawn lock, held around a spawn and :func:`add_leader`
    (``with reaper.spawning():``): the reaper never reaps a handler that exited before it
    was registered (its caller would then read a wrong exit status). A plain lock, not a
    generator context manager: it is taken for every spawn."""
    lock = getattr(_local, "lock", None)
    if lock is None:
        lock = _local.lock = threading.Lock()
        with _lock:
            _spawn_locks.append(lock)
    return lock


def _prctl_subreaper(on: bool) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def start() -> None:
    """Become a child subreaper and start watching children (counted: every
    :func:`start` needs a :func:`stop`). The first start also ends the leftovers of
    daemons that died (:func:`end_orphans`)."""
    global _users, _thread
    with _lock:
        _users += 1
        if _users > 1:
            return
        if not _prctl_subreaper(True):
            log.info("not a child subreaper (not Linux?): escaped descendants are not ended")
        end_orphans()
        _stop.clear()
        _thread = threading.Thread(target=_watch, name="flowrun-reaper", daemon=True)
        _thread.start()


def stop() -> None:
    """Undo one :func:`start`; the last one ends every adopted descendant (SIGKILL),
    reaps them and stops being a subreaper."""
    global _users, _thread
    with _lock:
        _users -= 1
        if _users > 0 or _thread is None:
            return
        _stop.set()
        _busy.set()
        _thread.join(5)
        _thread = None
        kill_all(signal.SIGKILL)
        sweep()
        _prctl_subreaper(False)


def kill_all(sig: int = signal.SIGKILL) -> None:
    """Signal every running handler's group and every adopted descendant of ours (the
    worker's abort)."""
    for pgid in list(leaders):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid, (state, _sid) in _children().items():
        if state != "Z" and pid not in leaders and _token(pid).startswith(_prefix):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _watch() -> None:
    idle = False
    while not _stop.is_set():
        if idle:  # nothing to end or reap until an attempt starts
            _busy.wait(IDLE_EVERY)
        else:
            _stop.wait(EVERY)
        _busy.clear()
        if _stop.is_set():
            return
        try:
            idle = not sweep()
        except Exception:  # noqa: BLE001 - keep watching; never take the worker down
            idle = False
            log.exception("reaper sweep failed")


def sweep() -> bool:
    """One look at our children: end escapees of ended attempts, reap the dead. Returns
    whether anything may need a look soon: an attempt runs, a handler's exit is not
    collected yet, or this process has a child."""
    now = time.monotonic()
    own_sid = os.getsid(0)
    dead: list[int] = []
    children = _children()
    for pid, (state, sid) in children.items():
        if pid in leaders:
            continue
        if state == "Z":
            if sid != own_sid or pid in _signalled:
                dead.append(pid)
            continue
        token = _token(pid)
        if not token.startswith(_prefix) or token in _running:
            continue
        when = _signalled.get(pid)
        try:
            if when is None:
                os.kill(pid, signal.SIGTERM)
                _signalled[pid] = now + GRACE
            elif now >= when:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if dead:
        _reap(dead)
    return bool(_running or leaders or children or _signalled)


def _reap(pids: list[int]) -> None:
    """Reap the dead ``pids`` that are not handlers: the spawns under way are waited for
    (their threads' locks; the C extension's hold) and none started meanwhile, so a
    handler that exited before it was registered is never taken for an orphan."""
    locks = list(_spawn_locks)
    for lock in locks:
        lock.acquire()
    ext = native.ext
    if ext is not None:
        ext.hold_reaps(True)
    try:
        for pid in pids:
            if pid in leaders or (ext is not None and ext.is_pending(pid)):
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            _signalled.pop(pid, None)
    finally:
        if ext is not None:
            ext.hold_reaps(False)
        for lock in locks:
            lock.release()


def _children(tasks: tuple[str, ...] | None = None) -> dict[int, tuple[str, int]]:
    """``{pid: (state letter, session id)}`` of this process's children: those of the main
    thread (adopted orphans are re-parented to it, whose ``children`` file lists them),
    or of every thread in ``tasks`` (thread ids, as in ``/proc/self/task``)."""
    pids: list[str] = []
    for task in tasks or (str(os.getpid()),):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += f.read().split()
        except OSError:
            continue
    out: dict[int, tuple[str, int]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        out[int(pid)] = (fields[0].decode(), int(fields[3]))
    return out


def _token(pid: int | str) -> str:
    """The :data:`TOKEN_ENV` value in ``pid``'s environment, or ``""``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return ""
    key = TOKEN_ENV.encode() + b"="
    at = env.find(b"\0" + key)
    if at < 0:
        if not env.startswith(key):
            return ""
        at = -1
    start = at + 1 + len(key)
    end = env.find(b"\0", start)
    return env[start : end if end >= 0 else None].decode(errors="replace")


def end_orphans() -> int:
    """SIGKILL every process of this user whose token names a daemon that no longer runs
    (one pass over ``/proc``); returns how many. A live daemon's token is left alone."""
    alive: dict[str, bool] = {}
    killed = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for name in entries:
        if not name.isdigit():
            continue
        token = _token(name)
        if not token or token.startswith(_prefix):
            continue
        owner = token.rsplit(".", 1)[0]
        if owner not in alive:
            pid, _, ticks = owner.partition(".")
            alive[owner] = pid.isdigit() and _start_ticks(pid) == ticks
        if not alive[owner]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(name), signal.SIGKILL)
                killed += 1
    if killed:
        log.warning("ended %d handler processes left by daemons that died", killed)
    return killed
