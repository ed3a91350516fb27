"""Is a worker alive? The one verdict shown by ``flowrun workers``, its ``--json`` and the
console's workers view (all through ``runner.ops.queries.read_workers``).

A worker writes ``workers.heartbeat_at`` every ``heartbeat`` seconds (2 s, see
``runner.engine.worker``). A heartbeat can be late for innocent reasons: a long GC pause, a busy
database, a host under load. So a worker is declared **dead** only when BOTH hold:

1. its heartbeat is stale: older than ``STALE_BEATS`` (3) heartbeat intervals, and
2. it holds no lease that is still valid (instance or sensor ``locked_until`` in the
   future): while it holds one, no other worker may take that work anyway, and the worker
   may still renew it.

Verdicts: ``alive`` (fresh heartbeat), ``late`` (stale heartbeat but a valid lease: not
yet dead; its leases expire at ``lease_until``), ``dead`` (stale and no valid lease: its
work, if any, is recoverable by any worker), ``stopped`` (it said goodbye:
``stopped_at`` is set). ``alive`` in the JSON is true for ``alive`` and ``late``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Default heartbeat interval of ``runner.engine.worker.WorkerConfig`` (seconds).
HEARTBEAT = 2.0
#: A heartbeat older than this many intervals is stale.
STALE_BEATS = 3


@dataclass(frozen=True)
class Liveness:
    """The verdict on one worker at one moment.

    Attributes:
        verdict: ``alive``, ``late``, ``dead`` or ``stopped``.
        alive: True for ``alive`` and ``late`` (it may still be working).
        heartbeat_age: seconds since its last heartbeat.
        leases: how many instance/sensor leases it holds that are still valid.
        lease_until: when the last of those expires (epoch seconds), or ``None``.
    """

    verdict: str
    alive: bool
    heartbeat_age: float
    leases: int
    lease_until: float | None


def judge(
    heartbeat_at: float,
    stopped_at: float | None,
    now: float,
    *,
    leases: int = 0,
    lease_until: float | None = None,
    heartbeat: float = HEARTBEAT,
) -> Liveness:
    """Decide whether a worker is alive.

    Args:
        heartbeat_at: its last heartbeat (epoch seconds).
        stopped_at: when it stopped cleanly, or ``None``.
        now: the current time (epoch seconds).
        leases: how many leases it holds (valid or not; only valid ones count).
        lease_until: the latest ``locked_until`` among its leases, or ``None``.
        heartbeat: its heartbeat interval in seconds.
    """
    age = max(0.0, now - heartbeat_at)
    valid = lease_until is not None and lease_until > now
    held = leases if valid else 0
    until = lease_until if valid else None
    if stopped_at is not None:
        return Liveness("stopped", False, age, held, until)
    if age <= STALE_BEATS * heartbeat:
        return Liveness("alive", True, age, held, until)
    if valid:
        return Liveness("late", True, age, held, until)
    return Liveness("dead", False, age, 0, None)
