"""The rows the worker's hot path passes around.

``Claim`` (an instance claimed with its attempt running) and ``Outcome`` (what a finished
attempt writes) are shared by the claim side (``runner.store.leases``) and the commit side
(``runner.store.commit``); the statements both run thousands of times a second are
``runner.store.hot``'s. Here too: what a claim may pick up (:data:`CLAIMABLE`,
:data:`PRIORITIES`, :func:`due_clause`), the columns it returns (:data:`CLAIM_COLS`), and
the parameters of an attempt's row (:func:`attempt_row`, :func:`running_attempt_row`).

An attempt's row is written once, when the attempt ends (``Hot.close_attempts``). While it
runs, the instance row says so: ``running_attempt`` (its number), ``locked_by`` (its
worker) and ``state_attempted`` (when it started); a checkpoint writes the row early, still
open (``outcome`` NULL), and the end completes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    and_,
    literal_column,
    or_,
)

from runner.store.tables import instances

#: Statuses a claim may pick up (``sleeping`` ones wake once due).
CLAIMABLE = ("runnable", "sleeping")

#: Every priority, highest first (``priority IN (...)``: one range of
#: ``ix_instances_claim`` per priority, read in the claim's order).
PRIORITIES = tuple(range(9, 0, -1))

#: The columns a claim reads back (``RETURNING``), in this order.
CLAIM_COLS = (
    instances.c.id,
    instances.c.flow,
    instances.c.version,
    instances.c.state,
    instances.c.data,
    instances.c.fence,
    instances.c.attempts,
    instances.c.errors,
    instances.c.restarts,
    instances.c.state_errors,
    instances.c.state_restarts,
    instances.c.event_id,
    instances.c.status,
    instances.c.pool,  # the seat last held (``runner.store.pools.settle``)
    instances.c.due_at,
    instances.c.priority,
    instances.c.start_priority,
    instances.c.limit_key,  # its flow limit (``runner.store.flow_limits``)
    instances.c.runs_on,  # its state's requirement (``runner.labels``)
    instances.c.route_event,  # the starting event's fields its runs_on may name
    instances.c.pool_slots,  # with ``pool``: the seat the claim itself recorded
)

#: Where ``limit_key`` is in a claim row (:data:`CLAIM_COLS`).
LIMIT_KEY_AT = [c.name for c in CLAIM_COLS].index("limit_key")
#: Where ``pool_slots`` is in a claim row (:data:`CLAIM_COLS`).
POOL_SLOTS_AT = [c.name for c in CLAIM_COLS].index("pool_slots")


def due_clause(at, statuses: tuple[str, ...] = CLAIMABLE, *, keys=None):
    """Due and unlocked at ``at`` (epoch seconds, or a bind parameter): what a claim takes
    (of ``statuses``, by default every claimable one; or, with ``keys``, of the status
    and priority those two columns name).

    The statuses are literals, so the clause compiles to one fixed SQL string.
    """
    if keys is None:
        keyed = and_(
            instances.c.status.in_([literal_column(f"'{s}'") for s in statuses]),
            # every priority named: ``ix_instances_claim`` (status, priority DESC,
            # due_at) is read as one range of due rows per priority, never every row
            instances.c.priority.in_([literal_column(str(p)) for p in PRIORITIES]),
        )
    else:
        keyed = and_(instances.c.status == keys[0], instances.c.priority == keys[1])
    return and_(
        keyed,
        instances.c.due_at <= at,
        or_(instances.c.locked_until.is_(None), instances.c.locked_until < at),
        # an attempt a dead worker left running is recorded ``lost`` first
        # (``store.recover_lost``); only then is its instance claimable again
        instances.c.running_attempt.is_(None),
    )


@dataclass
class Claim:
    """One claimed instance with the attempt just started for it (``attempt`` is 1-based;
    ``started_at`` in epoch seconds)."""

    id: int
    flow: str
    version: str
    state: str
    data: dict[str, Any]
    fence: int
    attempt: int
    errors: int
    restarts: int
    state_errors: list[float]
    state_restarts: int
    event_id: int | None
    started_at: float = 0.0
    chain: int = 0  # moves made since this instance was last claimed from the table
    pool: str | None = None  # the pool whose slots the attempt holds (``store.pools``)
    pool_slots: int = 0
    pool_rated: bool = False  # its pool has a rate: never chained into the same pool
    limit: str | None = None  # the flow limit it holds (``store.flow_limits``)
    priority: int = 5  # the row's (1..9)
    pinned: bool = False  # ``flowrun start --priority`` gave it: no state changes it
    runs_on: str | None = None  # its state's requirement (``runner.labels.canonical``)
    route_event: dict[str, Any] | None = None  # the event fields its runs_on may name
    #: a standby (``pools.Seat.standby``): claimed with no seat, it starts only in the
    #: seat of this worker's attempt of pool ``standby_pool`` as that one ends
    #: (``runner.engine.seats``); ``pool`` and ``pool_slots`` are set then
    standby_pool: str | None = None
    #: the claim whose seat it was handed, while that claim's commit (which records the
    #: seat as this one's) is not done: its own commit waits for it
    seat_from: Claim | None = field(default=None, repr=False, compare=False)
    #: the claim (a standby) its seat was handed to as its attempt ended
    seat_to: Claim | None = field(default=None, repr=False, compare=False)

    def keeps_route(self, values: dict[str, Any]) -> bool:
        """An outcome's ``values`` leave the row's ``runs_on`` as it is (no move, or a
        move to the same requirement): a chained attempt need not write it, and this
        worker, which matched it, may run it."""
        return "runs_on" not in values or values["runs_on"] == self.runs_on

    def keeps_priority(self, priority: int | None) -> bool:
        """Entering a state of ``priority`` (``None``: no move) leaves the row's as it is
        (so a chained attempt need not write it)."""
        return priority is None or self.pinned or priority == self.priority


@dataclass
class Outcome:
    """What one finished attempt does to its instance and attempt rows.

    ``values`` holds the instance columns to write (the worker computes them from the
    flow's policy); ``attempt_values`` the attempt columns (outcome, to_state, error,
    checkpoint). ``values`` is ignored when the fence no longer matches. ``claim`` is the
    claim the attempt ran under (its state, fence and start go into the attempt row).
    """

    claim: Claim
    values: dict[str, Any]
    attempt_values: dict[str, Any]
    chain: bool = False  # keep the lease and start the next attempt at once
    unchanged: tuple[str, ...] = ()  # JSON columns equal to the stored value: not rewritten
    #: its commit gave up the claim's pool seat in the same ``UPDATE`` (``Hot.commit_pooled``;
    #: on PostgreSQL ``batch.commit_statement``):
    #: ``pools.release`` has no seat of it to clear (only its waiters to wake)
    seat_freed: bool = False

    @property
    def instance_id(self) -> int:
        """The instance's id."""
        return self.claim.id

    @property
    def attempt(self) -> int:
        """The attempt's 1-based number."""
        return self.claim.attempt

    @property
    def fence(self) -> int:
        """The fence the attempt was claimed under."""
        return self.claim.fence


def next_claim(o: Outcome, at: float) -> Claim:
    """The claim of the attempt that continues ``o`` (a chained outcome) at ``at`` (epoch
    s): the same instance, lease and fence, the next attempt number, the outcome's values."""
    prev, v = o.claim, o.values
    assert v["status"] == "runnable", "only a runnable outcome keeps its lock"
    return Claim(
        id=prev.id,
        flow=prev.flow,
        version=prev.version,
        state=v["state"],
        data=v["data"],
        fence=prev.fence,
        attempt=prev.attempt + 1,
        errors=v["errors"],
        restarts=v["restarts"],
        state_errors=list(v["state_errors"]),
        state_restarts=v["state_restarts"],
        event_id=prev.event_id,
        started_at=at,
        chain=prev.chain + 1,
        pool=prev.pool,  # chained only into a state holding the same slots
        pool_slots=prev.pool_slots,
        pool_rated=prev.pool_rated,
        priority=prev.priority,  # chained only where it stays (``Claim.keeps_priority``)
        pinned=prev.pinned,
        limit=prev.limit,  # the same flow: its limit is kept
        runs_on=prev.runs_on,  # chained only where it stays (``Claim.keeps_route``)
        route_event=prev.route_event,
    )


def attempt_row(
    claim: Claim,
    worker_id: str,
    at: float,
    outcome: str,
    to_state: str | None = None,
    error: str | None = None,
    checkpoint=None,
    log_bytes: int | None = None,
) -> dict[str, Any]:
    """The parameters of :attr:`Hot.close_attempts` for ``claim``'s attempt ending at
    ``at`` (epoch seconds); ``checkpoint`` must already be adapted (``Hot.json``);
    ``log_bytes``: what its handler wrote to its attempt log (``None``: not captured)."""
    return {
        "i": claim.id,
        "a": claim.attempt,
        "s": claim.state,
        "w": worker_id,
        "f": claim.fence,
        "t": claim.started_at,
        "at": at,
        "outcome": outcome,
        "to_state": to_state,
        "error": error,
        "checkpoint": checkpoint,
        "lb": log_bytes,
    }


def running_attempt_row(instance, at: float, outcome: str, error: str) -> dict[str, Any]:
    """The parameters of :attr:`Hot.close_attempts` that end the attempt an instance row
    says is running (``lost``, when its worker's lease expired), from that row alone:
    ``instance`` is a mapping of ``instances`` columns with ``running_attempt`` set; its
    ``state_attempted`` is the start (``at``, epoch seconds, when unknown)."""
    started = instance["state_attempted"]
    return {
        "i": instance["id"],
        "a": instance["running_attempt"],
        "s": instance["state"],
        "w": instance["locked_by"] or "?",
        "f": instance["fence"],
        "t": at if started is None else started,
        "at": at,
        "outcome": outcome,
        "to_state": None,
        "error": error,
        "checkpoint": None,
        "lb": None,
    }
