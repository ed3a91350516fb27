"""Pools as the operator sees and changes them: ``flowrun pool ls|set|reset``, ``explain``'s
"waiting for pool", the metrics and the console's pools view all read :func:`read_pools`
(SQL text run through a ``runner.store.reader.Reader``); the writes go through
``runner.store.pools`` in one transaction each.
"""

from __future__ import annotations

import time
from typing import Any

from runner.store.limit_names import is_limit
from runner.store.reader import reader_of

_POOLS = "SELECT name, declared, slots, rate, starts FROM pools ORDER BY name"
_HOLDERS = (
    "SELECT pool, id, pool_slots, locked_by FROM instances"
    " WHERE pool IS NOT NULL AND running_attempt IS NOT NULL AND locked_until >= :now"
    " UNION ALL SELECT limit_key, id, 1, locked_by FROM instances"  # flow limits
    " WHERE limit_key IS NOT NULL AND running_attempt IS NOT NULL AND locked_until >= :now"
    " ORDER BY 1, 2"
)
_WAITING = (
    "SELECT waiting_for, count(*) FROM instances"
    " WHERE waiting_for IS NOT NULL AND due_at IS NULL"
    " AND status IN ('runnable', 'sleeping') GROUP BY waiting_for"
)


def read_pools(db: Any, *, now: float | None = None) -> list[dict[str, Any]]:
    """Every recorded pool at ``now`` (epoch seconds; default: the current time), by
    name: ``name`` (a pool, ``<flow>.<state>`` for a state's own rate, or a flow's
    ``max_running``: ``flow:<flow>[:<key>]``, ``runner.store.flow_limits``), ``slots`` (the
    size in force; ``None`` for a state's rate), ``rate`` (``"10/1m"`` or ``None``),
    ``recent_starts`` (starts within the rate's window), ``declared`` (the flow files'),
    ``set`` (the operator's number, ``None`` when the declared one is in force),
    ``in_use`` (slots held by attempts under a valid lease), ``holders`` (their instance
    ids), ``workers`` (the workers running them, sorted), ``waiting`` (instances waiting
    for a slot). ``db`` is a ``Reader`` or an ``Engine``.

    Raises:
        sqlite3.Error, sqlalchemy.exc.SQLAlchemyError: the database cannot be read.
    """
    from runner.flowspec.spec_types import parse_rate  # pydantic: only when pools are listed

    now = time.time() if now is None else now
    reader = reader_of(db)
    with reader.snapshot() as run:
        found = run(_POOLS, {})
        holders = run(_HOLDERS, {"now": now})
        waiting = dict(tuple(r) for r in run(_WAITING, {}))
    out = []
    for name, declared, slots, rate, starts in found:
        held = [h for h in holders if h[0] == name]
        state_rate = "." in name and not is_limit(name)  # a state's own rate: no slots
        starts = reader.load_json(starts) or []
        window = parse_rate(rate)[1] if rate else 0.0
        out.append(
            {
                "name": name,
                "slots": None
                if state_rate
                else slots
                if slots is not None
                else declared
                if declared is not None
                else 1,
                "rate": rate,
                "recent_starts": sum(1 for t in starts if t > now - window),
                "declared": declared,
                "set": slots,
                "in_use": sum(h[2] or 0 for h in held),
                "holders": [h[1] for h in held],
                "workers": sorted({h[3] for h in held if h[3]}),
                "waiting": int(waiting.get(name, 0)),
            }
        )
    return out


def pool_of(db: Any, name: str, *, now: float | None = None) -> dict[str, Any] | None:
    """:func:`read_pools`' entry of pool ``name``, or ``None`` when not recorded."""
    return next((p for p in read_pools(db, now=now) if p["name"] == name), None)


def set_pool(engine: Any, name: str, slots: int | None) -> None:
    """Set pool ``name``'s size at run time (``None``: back to the flow files'), waking
    the waiters it lets run; obeyed by every daemon at its next claim.

    Raises:
        UserError: an unknown pool, or ``slots`` below 0 (exit 2).
    """
    from runner.store.clock import db_now
    from runner.store.pools import set_slots

    with engine.begin() as conn:
        set_slots(conn, name, slots, db_now(conn))
