"""When the worker starts its next database cycle, and how much it claims: one pure
decision, :func:`plan` (counts and monotonic times in a :class:`Pace`, a :class:`Step`
out).

Four rules meet there. Claim-ahead (``ahead``): the ``room`` to claim counts the
instances held claimed ahead of the free slots. Batch waiting (``batching``): while the
worker is nearly full, finished attempts wait up to ``batching.HOLD_MAX`` for company
before their cycle starts. The overlapped second cycle (``cycle_runner``, PostgreSQL):
while one cycle is in flight a second starts only for claims to give back,
``OVERLAP_MIN`` finished attempts or more, or ``OVERLAP_MIN`` or more to claim where the
last claim left off; and a cycle that starts alone while attempts end in bulk claims
half the room (``split``), the second the rest, so that the loop runs one half while the
server works on the other. Chaining: a claim that got all it asked for, or a wake-up,
sets ``want_claim`` (claim again at once).

The worker keeps the mechanics: it reads its timers, cycle runner and attempts into a
``Pace``, and acts on the ``Step`` (submits the cycle, restarts the timers, tells the
attempts when to wake the loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.engine.batching import HOLD_MAX, batch_size, held
from runner.engine.cycle_runner import OVERLAP_MIN

# Not frozen: a frozen dataclass's ``__init__`` (``object.__setattr__`` per field) cost
# 4 us a turn of the loop, against 0.3 us; both are read only once made.


@dataclass(slots=True)
class Pace:
    """What the loop knows at a turn.

    Attributes:
        now: monotonic seconds.
        room: instances the next cycle may claim (free slots and claims to hold ahead,
            less those waiting and those the cycles in flight may claim).
        release: waiting claims are to be given back.
        finished: finished attempts waiting to be committed.
        flights: cycles in flight; most: how many may be at once (1, or 2 on PostgreSQL).
        want_claim: claim at once (the last claim was full, or a wake-up came).
        probe: an idle look for due work is due (and may find something).
        recover: a look for attempts lost by dead workers is due.
        running: attempts running (0 while stopping: never wait for a batch).
        concurrency: the worker's slots.
        held_since: when finished attempts began waiting for a batch (``None``: they
            do not wait).
    """

    now: float
    room: int
    release: bool = False
    finished: int = 0
    flights: int = 0
    most: int = 1
    want_claim: bool = False
    probe: bool = False
    recover: bool = False
    running: int = 0
    concurrency: int = 1
    held_since: float | None = None


@dataclass(slots=True)
class Step:
    """The decision: ``start`` a cycle claiming up to ``claim`` instances (``split``: half
    the room, the next cycle claims the rest, so claim again at once; ``probe``: it is
    an idle look), or not, with the finished attempts ``held_since`` then, waiting for a
    batch until ``hold_until`` (monotonic seconds), meanwhile woken only once at most
    ``quiet_above`` attempts run (``None``: at every end)."""

    start: bool = False
    claim: int = 0
    split: bool = False
    probe: bool = False
    held_since: float | None = None
    hold_until: float | None = None
    quiet_above: int | None = None


#: No cycle, nothing held (shared: never changed).
NOTHING = Step()


def plan(p: Pace) -> Step:
    """The next :class:`Step` for :class:`Pace` ``p`` (pure; the result is not to be
    changed: it may be :data:`NOTHING`)."""
    if p.flights and not (
        p.release or p.finished >= OVERLAP_MIN or (p.want_claim and p.room >= OVERLAP_MIN)
    ):
        return Step(held_since=p.held_since)  # the cycle in flight is enough
    wanted = p.room > 0 and (p.want_claim or p.probe)
    if not (p.finished or p.release or p.recover or wanted):
        return NOTHING
    if not (p.recover or p.release or p.flights):
        since = held(p.held_since, p.now, p.running, p.concurrency)
        if since is not None:  # nearly full: more attempts end soon, commit them together
            quiet = p.concurrency - batch_size(p.concurrency)
            return Step(held_since=since, hold_until=since + HOLD_MAX, quiet_above=quiet)
    split = p.most > 1 and not p.flights and p.finished >= OVERLAP_MIN and p.room >= 2 * OVERLAP_MIN
    return Step(True, p.room // 2 if split else p.room, split, p.probe)
