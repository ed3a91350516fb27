"""When the worker starts its next database cycle, and how much it claims: one pure
decision, :func:`plan` (counts and monotonic times in, a :class:`Step` out).

Four rules meet there. Claim-ahead (``ahead``): the ``room`` to claim counts the
instances held claimed ahead of the free slots. Batch waiting (``batching``): while the
worker is nearly full, finished attempts wait up to ``batching.HOLD_MAX`` for company
before their cycle starts. The overlapped second cycle (``cycle_runner``, PostgreSQL):
while one cycle is in flight a second starts only for claims to give back,
``OVERLAP_MIN`` finished attempts or more, or ``OVERLAP_MIN`` or more to claim where the
last claim left off; and a cycle that starts alone while attempts end in bulk claims
half the room (``split``), the second the rest, so that the loop runs one half while the
server works on the other; but not while the worker's claims fill a pool
(:data:`FILLED_FOR`): a pool's slots free only as their attempts commit, so two half
claims in flight would each find half the slots. Chaining: a claim that got all it
asked for, or a wake-up, sets ``want_claim`` (claim again at once).

The worker keeps the mechanics: it reads its timers, cycle runner and attempts, and acts
on the ``Step`` (submits the cycle, restarts the timers, tells the attempts when to wake
the loop).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.engine.batching import HOLD_MAX, batch_size, held
from runner.engine.cycle_runner import OVERLAP_MIN


@dataclass(slots=True)
class Step:
    """The decision: ``start`` a cycle claiming up to ``claim`` instances (``split``: half
    the room, the next cycle claims the rest, so claim again at once; ``probe``: it is
    an idle look), or not, with the finished attempts ``held_since`` then, waiting for a
    batch until ``hold_until`` (monotonic seconds), meanwhile woken only once at most
    ``quiet_above`` attempts run (``None``: at every end). Read only once made (not
    frozen: a frozen dataclass's ``__init__`` costs several times more, once a turn)."""

    start: bool = False
    claim: int = 0
    split: bool = False
    probe: bool = False
    held_since: float | None = None
    hold_until: float | None = None
    quiet_above: int | None = None


#: Seconds after a claim left a pool (or a flow limit) with no slot free during which
#: no cycle claims half the room: the pool's slots free only as their attempts' commits
#: release them, so two cycles in flight each claiming half would each find half of
#: them, and both would wait on the pool's row lock anyway (``store.pool_settle``).
FILLED_FOR = 0.25

#: No cycle, nothing held (shared: never changed).
NOTHING = Step()


def plan(
    now: float,
    room: int,
    release: bool = False,
    finished: int = 0,
    flights: int = 0,
    most: int = 1,
    want_claim: bool = False,
    probe: bool = False,
    recover: bool = False,
    running: int = 0,
    concurrency: int = 1,
    held_since: float | None = None,
    filled: bool = False,
) -> Step:
    """The next :class:`Step` (pure; the result is not to be changed: it may be
    :data:`NOTHING`). Plain arguments, not an object: this runs at every turn of the loop.

    Args:
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
        filled: a claim filled a pool within :data:`FILLED_FOR`: never split.
    """
    if flights and not (release or finished >= OVERLAP_MIN or (want_claim and room >= OVERLAP_MIN)):
        return Step(held_since=held_since)  # the cycle in flight is enough
    wanted = room > 0 and (want_claim or probe)
    if not (finished or release or recover or wanted):
        return NOTHING
    if not (recover or release or flights):
        since = held(held_since, now, running, concurrency)
        if since is not None:  # nearly full: more attempts end soon, commit them together
            quiet = concurrency - batch_size(concurrency)
            return Step(False, 0, False, False, since, since + HOLD_MAX, quiet)
    bulk = finished >= OVERLAP_MIN and room >= 2 * OVERLAP_MIN
    split = most > 1 and bulk and not (flights or filled)
    return Step(True, room // 2 if split else room, split, probe)
