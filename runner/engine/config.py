"""The options of one worker (``runner.engine.worker.Worker``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.labels import canonical, parse

#: ``--concurrency`` by default: this many attempts at once per core ...
PER_CORE = 16
#: ... but never more than this.
CONCURRENCY_MAX = 256


def default_concurrency() -> int:
    """The default ``--concurrency``: :data:`PER_CORE` attempts per core this process may
    run on (its CPU affinity), at most :data:`CONCURRENCY_MAX` (32 on 2 cores).

    Short ``exec`` handlers are bounded by how fast processes can be started, which grows
    with the cores; a worker reaches that ceiling only with enough attempts in flight to
    fill its batches (8 on 2 cores gave 0.67-0.79x of it, 32 0.98x). No-op and ``call``
    handlers lose nothing with more slots, and I/O-bound ones (waiting on a network) gain.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return min(CONCURRENCY_MAX, PER_CORE * max(1, cores))


@dataclass
class WorkerConfig:
    """Options of one worker; every duration is in seconds.

    ``concurrency`` is the most attempts run at once (default: :func:`default_concurrency`,
    16 per core).

    ``poll`` is the idle wait between looks for due work (a local wake-up, e.g. a sensor
    creating an instance, cuts it short). With ``listen`` (set by the daemon on
    PostgreSQL, which then feeds :meth:`Worker.notify_due` from a ``LISTEN`` connection,
    ``runner.store.notify``) the worker sleeps until the earliest due time or lease expiry
    it knows, looking anyway every ``idle_poll`` seconds (``None``: half the lease; ``0``:
    never). ``fence_poll`` how often running attempts are
    checked for commands; ``grace`` how long a graceful stop waits for running attempts.
    ``heartbeat`` the interval of this worker's heartbeat (``None``: a third of the lease,
    at most a minute, ``runner.store.heartbeat.heartbeat_interval``), recorded in its row.
    ``prefetch`` is the most instances claimed ahead of the free slots (``None``: as many
    as ``concurrency`` on PostgreSQL, none on SQLite; ``0``: never), as many as attempts
    ended in the last quarter second (``runner.engine.ahead``): each starts the moment a
    slot frees.
    ``overlap`` lets a second database cycle start while one is in flight, on PostgreSQL
    when the engine's pool holds two connections or more (``--pool-size``, default 2;
    ``runner.engine.cycle_runner``).
    ``labels`` are this worker's labels (``runner.labels.canonical`` JSON text; default:
    ``host`` only, its host name): it claims only instances whose ``runs_on`` they cover.
    ``on_tick``, if given, is called once per turn of the loop, on the loop's thread,
    while the loop is healthy (a liveness hook, e.g. a service watchdog); it must be quick
    and must not raise.
    """

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    lease: float = 60.0
    concurrency: int = field(default_factory=default_concurrency)
    prefetch: int | None = None
    poll: float = 0.05
    fence_poll: float = 0.25
    grace: float = 30.0
    kill_grace: float = 5.0
    heartbeat: float | None = None
    exit_when_idle: bool = False
    on_tick: Callable[[], None] | None = None
    listen: bool = False
    idle_poll: float | None = None
    overlap: bool = True
    labels: str = field(default_factory=lambda: canonical(parse(None)) or "{}")
