"""The options of one worker (``runner.engine.worker.Worker``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class WorkerConfig:
    """Options of one worker; every duration is in seconds.

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
    ``on_tick``, if given, is called once per turn of the loop, on the loop's thread,
    while the loop is healthy (a liveness hook, e.g. a service watchdog); it must be quick
    and must not raise.
    """

    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    lease: float = 60.0
    concurrency: int = 8
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
