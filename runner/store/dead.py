"""Workers provably dead: their locks are taken over at once, not when their leases
expire (``runner.store.leases.recover_lost``, ``runner.sensors.events.claim_leases``).

A worker is provably dead when its ``workers`` row names a process of this host and boot
that is gone (``runner.store.host.provably_dead``).
"""

from __future__ import annotations

from sqlalchemy import Connection, Table, select

from runner.store.host import current, provably_dead
from runner.store.tables import workers


def dead_holders(conn: Connection, table: Table, me: str) -> list[str]:
    """The ids of the workers holding a lock in ``table`` (``instances`` or ``sensors``:
    its ``locked_by``) whose process is provably dead (:func:`provably_dead`), other than
    ``me`` (a worker id), in the caller's transaction. Only workers of this host and boot
    are looked at (their rows' identity; one ``/proc`` read each): their locks can be
    taken over at once instead of when their leases expire."""
    here = current()
    if here.boot is None:
        return []
    w = workers.c
    holders = select(table.c.locked_by).where(table.c.locked_by > "").distinct()
    rows = conn.execute(
        select(w.id, w.host, w.boot_id, w.pid, w.pid_started).where(
            w.host == here.host, w.boot_id == here.boot, w.id != me, w.id.in_(holders)
        )
    ).all()
    return [r.id for r in rows if provably_dead(r.host, r.boot_id, r.pid, r.pid_started)]
