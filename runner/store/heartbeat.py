"""A worker's own row in ``workers``: registered at start, a heartbeat every few seconds,
stopped at the end (``runner.ops.liveness`` judges these rows; the console and ``flowrun
workers`` show them)."""

from __future__ import annotations

import os
import socket
import time

from sqlalchemy import Engine, update

from runner.store import leases
from runner.store.db import insert_ignore
from runner.store.tables import workers


def register(engine: Engine, worker_id: str) -> None:
    """Create or refresh the row of ``worker_id`` (host, pid, started now, not stopped)."""
    at = time.time()
    row = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": at,
        "heartbeat_at": at,
        "running": 0,
    }
    with engine.begin() as conn:
        insert_ignore(conn, workers, {"id": worker_id, **row})
        conn.execute(
            update(workers).where(workers.c.id == worker_id).values(**row, stopped_at=None)
        )


def beat(engine: Engine, worker_id: str, running: int) -> None:
    """Record a heartbeat now, with the number of attempts running."""
    with engine.begin() as conn:
        conn.execute(
            update(workers)
            .where(workers.c.id == worker_id)
            .values(heartbeat_at=time.time(), running=running)
        )


def stopped(engine: Engine, worker_id: str, running: int, release: bool) -> None:
    """Mark the worker stopped; with ``release``, free every lock it holds that has no
    attempt running (a graceful stop; an abort leaves them to expire)."""
    with engine.begin() as conn:
        if release:
            leases.release_all(conn, worker_id)
        conn.execute(
            update(workers)
            .where(workers.c.id == worker_id)
            .values(stopped_at=time.time(), running=running)
        )
