"""A rule's ``once_per``: at most one delivery per key per window, the others counted.

One home for the folding rule. A delivery of rule R with key K is queued unless one of R
and K was created less than ``window`` seconds before the handling transaction's time;
then that one's ``suppressed`` counts one more and none is queued. A new delivery
carries in ``folded_before`` how many its key folded since the key's previous delivery
(the next alert says how many were held back). Within one batch of events, the first of
a key that finds no delivery in its window queues one and the later ones fold into it.

:func:`queue_folding` does a batch (the rules' batch of events, with or without
``once_per``: one read per key, one ``INSERT`` for all the new deliveries, one
``UPDATE`` per delivery folded into, not a statement an event); :func:`queue` one event
(``events replay``). On PostgreSQL a transaction advisory lock per (rule, key), taken in
one order, serialises two daemons folding the same key.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, text, update

from runner.store.clock import db_now
from runner.store.deliveries import queue_many
from runner.store.dialect import dialect_of
from runner.store.tables import deliveries

_d = deliveries.c


@dataclass
class _Latest:
    """A key's latest delivery while a batch is folded: its ``id`` (when ``fresh`` is
    ``None``; else it is queued by this batch, at ``fresh`` in the new ones), when it
    was ``created`` (epoch s), the events it had ``suppressed`` before and those
    ``folded`` into it now."""

    id: int
    created: float
    suppressed: int
    folded: int = 0
    fresh: int | None = None


def _lock_key(rule: str, key: str) -> int:
    """The advisory lock of (``rule``, ``key``): a signed 32-bit number."""
    return zlib.crc32(f"{rule}\0{key}".encode()) - 2**31


def queue_folding(
    conn: Connection,
    rows: Sequence[dict[str, Any]],
    *,
    at: float,
    held_by: str | None = None,
    lease: float = 0.0,
) -> list[tuple[int, bool, int]]:
    """Queue or fold the deliveries ``rows`` in the caller's transaction, in their order
    (each as for ``deliveries.queue_many``; with ``once_key`` and ``window``, seconds, it
    folds as the module says, without one it is queued), all new ones in ONE ``INSERT``;
    ``at``: the transaction's database time (epoch s); ``held_by``/``lease``: the new
    ones are queued claimed by that daemon (``queue_many``). Returns, per row,
    ``(delivery id, queued, folded before)``: ``queued`` False when it folded into
    delivery ``id``; the last, for a queued one, its ``folded_before``."""
    keys = sorted({(r["rule"], r["once_key"]) for r in rows if r.get("once_key") is not None})
    if keys and dialect_of(conn).notify:  # PostgreSQL: one folding per key at a time
        for k in sorted({_lock_key(*key) for key in keys}):
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": k})
    latest: dict[tuple[str, str], _Latest] = {}
    for rule, key in keys:
        row = conn.execute(
            select(_d.id, _d.created_at, _d.suppressed)
            .where(_d.rule == rule, _d.once_key == key)
            .order_by(_d.created_at.desc())
            .limit(1)
        ).first()
        if row is not None:
            latest[(rule, key)] = _Latest(row.id, row.created_at, row.suppressed)
    fresh: list[dict[str, Any]] = []  # the new deliveries, in order
    into: list[tuple[_Latest, bool]] = []  # per row: its delivery, and queued (not folded)
    for r in rows:
        once_key = r.get("once_key")
        prev = None if once_key is None else latest.get((r["rule"], once_key))
        if prev is not None and prev.created > at - r["window"]:
            prev.folded += 1
            into.append((prev, False))
            continue
        before = 0 if prev is None else prev.suppressed + prev.folded
        fresh.append({**r, "suppressed": 0, "folded_before": before})
        made = _Latest(0, at, 0, fresh=len(fresh) - 1)
        if once_key is not None:
            latest[(r["rule"], once_key)] = made  # later rows of the key fold into it
        into.append((made, True))
    touched = {id(one): one for one, _ in into}.values()
    for one in touched:
        if one.fresh is not None:
            fresh[one.fresh]["suppressed"] = one.folded
    ids = queue_many(conn, fresh, at=at, held_by=held_by, lease=lease)
    for one in touched:
        if one.fresh is None and one.folded:
            conn.execute(
                update(deliveries)
                .where(_d.id == one.id)
                .values(suppressed=_d.suppressed + one.folded)
            )
    return [
        (one.id, False, 0)
        if one.fresh is None
        else (ids[one.fresh], queued, fresh[one.fresh]["folded_before"])
        for one, queued in into
    ]


def queue(
    conn: Connection,
    event_id: int,
    rule: str,
    target: dict[str, Any],
    *,
    retry_for: float,
    once_key: str | None = None,
    window: float | None = None,
) -> tuple[int, bool]:
    """Queue a delivery of ``target`` (``{"exec": argv}`` or ``{"webhook": {...}}``) for
    event ``event_id`` by ``rule`` (``rule:<flow>#<n>``) in the caller's transaction,
    due at once for any daemon, given up ``retry_for`` seconds after; with ``once_key``
    and ``window`` (seconds) folded as the module says. Returns ``(delivery id,
    queued)``: ``queued`` False when folded into delivery ``id``."""
    row = {"event_id": event_id, "rule": rule, "target": target, "retry_for": retry_for}
    if once_key is not None and window is not None:
        row.update(once_key=once_key, window=window)
    did, queued, _ = queue_folding(conn, [row], at=db_now(conn))[0]
    return did, queued
