"""A worker's own row in ``workers``: registered at start (with its process's identity,
``runner.store.host``), a heartbeat every few seconds, stopped at the end
(``runner.ops.liveness`` judges these rows; the console and ``flowrun workers`` show
them)."""

from __future__ import annotations

from sqlalchemy import Engine, update

from runner.store import host, leases
from runner.store.clock import db_now
from runner.store.db import insert_ignore
from runner.store.tables import workers

#: A worker beats every ``lease / LEASE_BEATS`` seconds ...
LEASE_BEATS = 3
#: ... but at least this often (seconds): a killed idle worker is called dead within three
#: times this (``runner.ops.liveness.STALE_BEATS``) however long the lease.
HEARTBEAT_MAX = 60.0


def heartbeat_interval(lease: float) -> float:
    """A worker's heartbeat interval in seconds for its ``lease`` (seconds, > 0).

    A third of the lease, so three missed beats (a stale heartbeat) take as long as a
    lease, the time a killed worker's claims take to lapse anyway: a killed idle worker is
    called dead about when a killed busy one would be (``late`` until its leases lapse), and
    an idle daemon's heartbeat costs the database ``3 / lease`` transactions a second (0.05
    at the default 60 s lease; 1.5 at 2 s). Capped at :data:`HEARTBEAT_MAX`.
    """
    return min(lease / LEASE_BEATS, HEARTBEAT_MAX)


def register(
    engine: Engine, worker_id: str, every: float | None = None, labels: str | None = None
) -> None:
    """Create or refresh the row of ``worker_id`` (host, boot id, pid and the process's
    start time: ``runner.store.host.Identity``; started now, not stopped), recording
    ``every``, its heartbeat interval in seconds (``runner.ops.liveness`` judges the row by
    it; ``None`` leaves it unset), and its ``labels`` (``runner.labels.canonical``;
    ``runner.store.routing`` matches instances' requirements with them)."""
    at = db_now(engine)
    me = host.current()
    row = {
        "host": me.host,
        "boot_id": me.boot,
        "pid": me.pid,
        "pid_started": me.started,
        "started_at": at,
        "heartbeat_at": at,
        "running": 0,
        "heartbeat_every": every,
        "labels": labels,
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
            .values(heartbeat_at=db_now(conn), running=running)
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
            .values(stopped_at=db_now(conn), running=running)
        )
