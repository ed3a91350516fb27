"""The WARNING lines a database cycle leaves for an operator: an instance whose attempt
failed it, spent its error budget or restarts, was killed or fenced out
(:func:`log_ended`, after each committed cycle) and an attempt recorded lost by a dead
worker (:func:`log_lost`); each one line naming the instance, its flow, state and kind
(``runner.warn_line``: JSON fields under ``--log-format json``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import DBAPIError

from runner.error_line import error_line
from runner.store import leases
from runner.store.db import reading
from runner.store.lifecycle_events import outcome_kind
from runner.store.rows import Claim
from runner.store.tables import instances
from runner.warn_line import warn

if TYPE_CHECKING:
    from runner.engine.cycle import CycleRequest

log = logging.getLogger("flowrun.worker")  # the worker's own log: these are its messages

#: The lifecycle kinds of an attempt's outcome that are one WARNING line (``log_ended``).
WARNED = ("failed", "budget_spent", "restarts_spent")


def log_ended(engine: Engine, request: CycleRequest, lost: Sequence[int]) -> None:
    """One WARNING line per instance a committed cycle left for an operator, naming it,
    its flow and state (``runner.warn_line``; fields ``instance``, ``flow``, ``state``,
    ``kind``): ``budget_spent`` (failed, paused or another state entered),
    ``restarts_spent``, ``failed`` (the lifecycle kinds of
    ``store.lifecycle_events.outcome_kind``), ``killed`` (a command killed it:
    its running attempt was cancelled, or its outcome fenced out), ``fenced_out`` (the
    outcome not committed: another worker or a command took the instance; ``holder`` and
    ``worker`` fields). ``lost``: the ids whose outcome the fence refused."""
    gone = set(lost)
    for o in request.outcomes:
        status = o.values["status"]
        kind = outcome_kind(o.attempt_values["outcome"], status)
        if kind in WARNED and o.claim.id not in gone:
            why = error_line(o.values["last_error"], 300, spent=True)
            to = "" if status != "runnable" else f"entered {o.values['state']!r}"
            _warn(o.claim, kind, f"{to or status}: {why}")
    cancelled = [c for c, _ in request.cancels]
    if not (gone or cancelled):
        return
    try:  # who holds them now, and were they killed; rare: only after a command
        with reading(engine) as conn:
            rows = conn.execute(
                select(instances.c.id, instances.c.status, instances.c.locked_by).where(
                    instances.c.id.in_([*gone, *(c.id for c in cancelled)])
                )
            ).all()
    except DBAPIError:
        rows = []
    now = {iid: (status, holder) for iid, status, holder in rows}
    for c in cancelled:
        if now.get(c.id, ("",))[0] == "killed":
            _warn(c, "killed", f"killed by a command; its attempt {c.attempt} was cancelled")
    for o in request.outcomes:
        if o.claim.id not in gone:
            continue
        c, (status, holder) = o.claim, now.get(o.claim.id, ("", None))
        if status == "killed":
            _warn(
                c,
                "killed",
                f"killed by a command; the outcome of attempt {c.attempt} was not committed",
            )
            continue
        holder = holder or "nobody (released)"
        _warn(
            c,
            "fenced_out",
            f"fenced out: the outcome of attempt {c.attempt} was not committed by "
            f"{request.worker_id}; held now by {holder}",
            worker=request.worker_id,
            holder=holder,
        )


def _warn(claim: Claim, kind: str, text: str, **fields: Any) -> None:
    warn(log, claim.id, claim.flow, claim.state, kind, text, **fields)


def log_lost(recovered: list[leases.Lost]) -> None:
    """Log each attempt a cycle recorded as lost by a dead worker (``leases.Lost`` list):
    one WARNING each, its ``kind`` ``restarts_spent`` when that spent the restarts (the
    instance failed), else ``lost``."""
    for lost in recovered:
        warn(
            log,
            lost.instance_id,
            lost.flow,
            lost.state,
            "restarts_spent" if lost.failed else "lost",
            f"attempt lost by worker {lost.worker} (attempt {lost.attempt}); "
            + (
                "restarts spent: instance failed"
                if lost.failed
                else "restarting from its last checkpoint"
            ),
            worker=lost.worker,
            attempt=lost.attempt,
        )
