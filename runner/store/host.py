"""This process's identity on its host, and whether a recorded process is provably gone.

A worker records in its ``workers`` row where it runs: the host name, the kernel's boot
id (``/proc/sys/kernel/random/boot_id``, new at every boot) with its pid namespace, its
pid and its start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot). With
the pid, the start time names one process for the life of the boot, whatever pid reuse
does.

A process is **provably dead** only when it ran on this host in this boot (host name,
boot id and pid namespace all ours) and its pid is gone or now names another process (a
different start time). Anything else (another host, another boot, a row without the
identity, a kernel without ``/proc``) proves nothing: such a worker is judged by its
heartbeat and leases.
No SQL here (the CLI's read side judges workers without SQLAlchemy); the workers whose
locks may be taken over are ``runner.store.dead``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache


def start_ticks(pid: int | str) -> int | None:
    """The start time of process ``pid`` (field 22 of ``/proc/<pid>/stat``: clock ticks
    since boot), or ``None`` when there is no such process (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


@cache
def boot_id() -> str | None:
    """This kernel's boot id (a UUID, new at every boot) and this process's pid namespace,
    as ``"<boot id> <namespace>"`` (e.g. ``"0f1e… pid:[4026531836]"``): two containers on
    one kernel share a boot id and may share a host name, but a pid means the same
    process only inside one pid namespace. ``None`` without ``/proc``."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        space = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot} {space}" if boot else None


@dataclass(frozen=True)
class Identity:
    """Where a process runs: ``host`` name, kernel ``boot`` id (``None``: unknown),
    ``pid`` and ``started`` (its start time in clock ticks since boot; ``None``:
    unknown)."""

    host: str
    boot: str | None
    pid: int
    started: int | None


def current() -> Identity:
    """This process's :class:`Identity` (the pid and start time read now: a fork has its
    own)."""
    return Identity(socket.gethostname(), boot_id(), os.getpid(), start_ticks("self"))


def provably_dead(host: str, boot: str | None, pid: int, started: int | None) -> bool:
    """True only when the process recorded as ``host``/``boot``/``pid``/``started`` ran
    on this host in this boot and is gone: no process ``pid`` any more, or one started at
    another time (the pid was reused). False whenever that cannot be proven (another host
    or boot, an identity not recorded, no ``/proc``)."""
    if boot is None or started is None or boot != boot_id() or host != socket.gethostname():
        return False
    return start_ticks(pid) != started
