"""Is a worker alive? The one verdict shown by ``flowrun workers``, its ``--json`` and the
console's workers view (all through :func:`read_workers`, SQL text run through a
``runner.store.reader.Reader``: stdlib ``sqlite3`` for the CLI on a SQLite file).

A worker writes ``workers.heartbeat_at`` every ``heartbeat`` seconds: a third of its
lease, at most a minute (``runner.store.heartbeat.heartbeat_interval``), and records that
interval in its row (``workers.heartbeat_every``), so every reader judges it by its own
interval; a row written before that column existed (``NULL``) is judged by the old fixed
interval, :data:`HEARTBEAT`.
A heartbeat can be late for innocent reasons: a long GC pause, a busy database, a host
under load. So a worker is declared **dead** only when BOTH hold:

1. its heartbeat is stale: older than ``STALE_BEATS`` (3) of its heartbeat intervals, and
2. it holds no lease that is still valid (instance or sensor ``locked_until`` in the
   future): while it holds one, no other worker may take that work anyway, and the worker
   may still renew it.

A worker of the reader's own host and boot whose process is provably gone (its pid
absent or reused: ``runner.store.host.provably_dead``, from the identity its row records)
is **dead** at once, whatever its heartbeat and leases say: any worker takes its leases
over at once (``runner.store.leases.recover_lost``, the sensor leases). A worker on
another host, or a row without that identity, is never judged that way.

Verdicts: ``alive`` (fresh heartbeat), ``late`` (stale heartbeat but a valid lease: not
yet dead; its leases expire at ``lease_until``), ``dead`` (stale and no valid lease: its
work, if any, is recoverable by any worker), ``stopped`` (it said goodbye:
``stopped_at`` is set). ``alive`` in the JSON is true for ``alive`` and ``late``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from runner.labels import decode
from runner.ops.views import iso
from runner.store.host import provably_dead
from runner.store.reader import WORKER_COLUMNS, EngineOrReader, as_dicts, columns, reader_of

#: The heartbeat interval (seconds) of workers whose row does not record theirs (written
#: before ``workers.heartbeat_every`` existed, when every worker beat every 2 s).
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
    heartbeat: float | None = None,
    gone: bool = False,
) -> Liveness:
    """Decide whether a worker is alive.

    Args:
        heartbeat_at: its last heartbeat (epoch seconds).
        stopped_at: when it stopped cleanly, or ``None``.
        now: the current time (epoch seconds).
        leases: how many leases it holds (valid or not; only valid ones count).
        lease_until: the latest ``locked_until`` among its leases, or ``None``.
        heartbeat: its heartbeat interval in seconds (``workers.heartbeat_every``);
            ``None`` (a row from before that column): :data:`HEARTBEAT`.
        gone: its process is provably dead (``runner.store.host.provably_dead``): dead
            now, unless it stopped cleanly.
    """
    if heartbeat is None or heartbeat <= 0:
        heartbeat = HEARTBEAT
    age = max(0.0, now - heartbeat_at)
    valid = lease_until is not None and lease_until > now
    held = leases if valid else 0
    until = lease_until if valid else None
    if stopped_at is not None:
        return Liveness("stopped", False, age, held, until)
    if gone:
        return Liveness("dead", False, age, 0, None)
    if age <= STALE_BEATS * heartbeat:
        return Liveness("alive", True, age, held, until)
    if valid:
        return Liveness("late", True, age, held, until)
    return Liveness("dead", False, age, 0, None)


def read_workers(db: EngineOrReader, *, now: float) -> list[dict[str, Any]]:
    """Every worker row (times in epoch seconds), newest heartbeat first, with the one
    liveness verdict of :func:`judge` at ``now`` (epoch seconds); ``db`` is a
    ``runner.store.reader.Reader`` or an ``Engine``.

    Each row adds ``verdict`` (alive/late/dead/stopped), ``alive`` (bool),
    ``heartbeat_age`` (seconds), ``leases`` (valid instance and sensor leases it holds),
    ``lease_until`` (when the last expires, or ``None``), ``holding`` (the attempts it
    runs now) and ``labels`` (``{name: value}``; ``{}`` for a row written before labels).
    A worker is dead only when its heartbeat is stale AND it holds no valid
    lease, or when its process is provably gone (this host and boot). ``flowrun
    workers`` (text and ``--json``) and the console's workers view all read this.

    Raises:
        sqlite3.Error, sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    reader = reader_of(db)
    held: dict[str, list[Any]] = {}
    with reader.snapshot() as run:
        found = run(f"SELECT {columns(WORKER_COLUMNS)} FROM workers ORDER BY heartbeat_at DESC", {})
        for table in ("instances", "sensors"):
            leases = run(
                f"SELECT locked_by, count(*), max(locked_until) FROM {table}"
                " WHERE locked_by IS NOT NULL AND locked_until > :now GROUP BY locked_by",
                {"now": now},
            )
            for who, count, until in leases:
                entry = held.setdefault(who, [0, None])
                entry[0] += count
                entry[1] = until if entry[1] is None else max(entry[1], until)
        running = dict(
            tuple(r)
            for r in run(
                "SELECT locked_by, count(*) FROM instances"
                " WHERE locked_by IS NOT NULL AND running_attempt IS NOT NULL GROUP BY locked_by",
                {},
            )
        )
    rows = as_dicts(reader, WORKER_COLUMNS, found)
    for r in rows:
        count, until = held.get(r["id"], (0, None))
        verdict = judge(
            r["heartbeat_at"],
            r["stopped_at"],
            now,
            leases=count,
            lease_until=until,
            heartbeat=r["heartbeat_every"],
            gone=provably_dead(r["host"], r["boot_id"], r["pid"], r["pid_started"]),
        )
        r.update(
            alive=verdict.alive,
            verdict=verdict.verdict,
            heartbeat_age=verdict.heartbeat_age,
            leases=verdict.leases,
            lease_until=verdict.lease_until,
            holding=int(running.get(r["id"], 0)),
            labels=decode(r["labels"]),
        )
    return rows


def list_workers(db: EngineOrReader, *, now: float | None = None) -> list[dict[str, Any]]:
    """:func:`read_workers` at ``now`` (default: the current time) with timestamps as ISO
    8601 UTC and ``heartbeat_age`` rounded to milliseconds: ``flowrun workers --json``.

    Raises:
        sqlite3.Error, sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    rows = read_workers(db, now=time.time() if now is None else now)
    for r in rows:
        r.update(
            {k: iso(r[k]) for k in ("started_at", "heartbeat_at", "stopped_at", "lease_until")}
        )
        r["heartbeat_age"] = round(r["heartbeat_age"], 3)
    return rows
