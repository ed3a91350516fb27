"""What a handler's process is set up with between its fork and its ``exec``: resource
limits, niceness, user and group; and which limit ended it.

:func:`proc_setup` turns a state's ``limits`` into a :class:`ProcSetup`, applied in the
child by both spawn paths (``runner.handlers.spawn``: ``_posixsubprocess`` with its own
``uid``/``gid`` and a ``preexec_fn`` for the limits; the C extension in
``_spawn_child.c``). :func:`limit_reached` names the limit a dead handler ran into.
"""

from __future__ import annotations

import functools
import grp
import math
import os
import pwd
import resource
import signal
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20

#: what the end of a handler that ran out of memory looks like in its output tail
_MEMORY_WORDS = ("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc")


@dataclass(frozen=True)
class ProcSetup:
    """Applied in a handler's process before its program starts.

    Attributes:
        rlimits: ``((resource.RLIMIT_*, soft, hard), ...)``, never above the daemon's
            own hard limits.
        nice: the niceness to set (0 to 19), or ``None``.
        uid: the user to become, or -1 (stay).
        gid: the group to become (no supplementary groups), or -1 (stay).
    """

    rlimits: tuple[tuple[int, int, int], ...] = ()
    nice: int | None = None
    uid: int = -1
    gid: int = -1

    def native(self) -> tuple[tuple[tuple[int, int, int], ...], int, int, int]:
        """The argument of ``runner.handlers._spawn.Spawner.submit``: ``(rlimits, nice
        or -1, uid, gid)``."""
        return (self.rlimits, -1 if self.nice is None else self.nice, self.uid, self.gid)

    def posix(self) -> tuple[Any, ...]:
        """``(gid, extra_groups, uid, preexec_fn)`` for ``_posixsubprocess.fork_exec``
        (and ``Popen``'s ``group``, ``extra_groups``, ``user``, ``preexec_fn``): ``None``
        for each that does not apply."""
        groups: list[int] | None
        gid, groups = (self.gid, []) if self.gid >= 0 else (None, None)
        uid = self.uid if self.uid >= 0 else None
        preexec = self.preexec if self.rlimits or self.nice is not None else None
        return gid, groups, uid, preexec

    def preexec(self) -> None:
        """The limits and niceness, set in the child by ``_posixsubprocess`` (after its
        ``setgid``/``setuid``: they only lower what the daemon has)."""
        for res, soft, hard in self.rlimits:
            resource.setrlimit(res, (soft, hard))
        if self.nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)


_RESOURCES = {
    "memory": resource.RLIMIT_AS,
    "files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
}


@functools.lru_cache(maxsize=256)
def proc_setup(limits: tuple[tuple[str, float], ...], uid: int = -1, gid: int = -1) -> ProcSetup:
    """The :class:`ProcSetup` of a state's ``limits`` (``HandlerSetup.limits``) and the
    ``uid``/``gid`` to drop to. A ``cpu`` limit of ``s`` seconds is a soft limit of
    ``ceil(s)`` (SIGXCPU) and a hard one a second later (SIGKILL, for a handler that
    ignores SIGXCPU). Worked out once per set-up; raises nothing."""
    rlimits = []
    nice = None
    for name, value in limits:
        if name == "nice":
            nice = int(value)
        elif name == "cpu":
            soft = max(1, math.ceil(value))
            rlimits.append(_clamped(resource.RLIMIT_CPU, soft, soft + 1))
        else:
            rlimits.append(_clamped(_RESOURCES[name], int(value), int(value)))
    return ProcSetup(tuple(rlimits), nice, uid, gid)


def _clamped(res: int, soft: int, hard: int) -> tuple[int, int, int]:
    """``(res, soft, hard)`` no higher than the daemon's own hard limit (which a process
    without privileges cannot raise)."""
    _, ours = resource.getrlimit(res)
    if ours != resource.RLIM_INFINITY:
        soft, hard = min(soft, ours), min(hard, ours)
    return res, soft, hard


def limit_reached(limits: tuple[tuple[str, float], ...], code: int, tail: str) -> str | None:
    """Which of ``limits`` ended a handler that exited with ``code`` (``-signal`` when
    killed) leaving ``tail`` as its output: ``"cpu limit 60 s reached"`` (SIGXCPU, or
    SIGKILL at the hard limit), ``"memory limit 512 MiB reached"`` (an allocation that
    failed: SIGSEGV/SIGABRT/SIGKILL, or an exit whose output says it ran out of memory);
    ``None`` when none did."""
    given = dict(limits)
    if "cpu" in given and code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"cpu limit {given['cpu']:g} s reached"
    if "memory" in given:
        died = code in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGKILL)
        if died or (code > 0 and any(w in tail for w in _MEMORY_WORDS)):
            return f"memory limit {_size(int(given['memory']))} reached"
    return None


def _size(n: int) -> str:
    """``512 MiB``, ``1.5 GiB`` or ``4096 bytes``."""
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    if n >= MIB:
        return f"{n / MIB:g} MiB"
    return f"{n} bytes"


@functools.lru_cache(maxsize=64)
def ids_of(user: str | int | None, group: str | int | None) -> tuple[int, int]:
    """``(uid, gid)`` to drop to for a state's ``user``/``group`` (names or ids), ``-1``
    for what stays: a user without a group gets the user's own group. Raises
    ``LookupError`` naming an unknown user or group."""
    uid = gid = -1
    if user is not None:
        try:
            entry = pwd.getpwnam(user) if isinstance(user, str) else pwd.getpwuid(user)
        except KeyError:
            if isinstance(user, str):
                raise LookupError(f"user {user!r}: no such user") from None
            uid = gid = user  # an id without a name: its own group
        else:
            uid, gid = entry.pw_uid, entry.pw_gid
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid if isinstance(group, str) else group
        except KeyError:
            raise LookupError(f"group {group!r}: no such group") from None
    return uid, gid
