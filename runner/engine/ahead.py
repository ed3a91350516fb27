"""How many instances a worker claims ahead of its free slots (``--prefetch``; by default
on PostgreSQL only: on SQLite a cycle runs on the loop in a millisecond or two).

A worker whose slots are all busy would otherwise wait for one database cycle (commit the
finished attempts, claim new ones: a few milliseconds on PostgreSQL, thread hops
included) each time attempts end before the freed slots run again. With attempts of
20 ms that idles a slot a fifth of the time. Claimed ahead, an instance waits in the
worker (claimed, its attempt named in ``running_attempt``, its lease renewed with the
running ones) and starts the moment a slot frees; the cycle that commits the finished
attempt and claims the next one runs meanwhile. pgqueuer's consumers do the same: they
dequeue a batch and run it as their concurrency allows.

A claimed-ahead instance cannot be taken by another worker while it waits, so a worker
claims ahead only as many as its attempts have been ending lately (:class:`ClaimAhead`:
the ends in the last :data:`WINDOW`, at most ``--prefetch``), and never starts one
claimed more than :data:`WAIT_MAX` ago (or half the lease, if shorter): that one is given
back (``commit.give_back``), so long handlers keep nothing waiting behind them for more
than about a second, and nothing starts on a lease that may be running out.
"""

from __future__ import annotations

#: Seconds over which the worker counts its attempts' ends (how many to claim ahead).
WINDOW = 0.25
#: Seconds a claimed-ahead instance may wait for a slot before it is given back (the
#: worker uses half its lease instead when that is shorter).
WAIT_MAX = 1.0


class ClaimAhead:
    """The number of instances to hold claimed beyond the free slots, at most ``limit``
    (``0``: never claim ahead): as many as attempts ended in the last :data:`WINDOW`
    seconds (the current window so far, or the whole previous one, whichever is more).

    :meth:`target` is given ``ends``, the attempts ended since the worker started (a
    counter that only grows), and ``now`` (monotonic seconds).
    """

    __slots__ = ("limit", "_mark_at", "_mark", "_previous", "_off_until")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._mark_at = -WINDOW  # when the current window began (monotonic seconds)
        self._mark = 0  # ``ends`` then
        self._previous = 0  # ends in the previous window
        self._off_until = -WINDOW  # no claim ahead before then (monotonic seconds)

    def refused(self, now: float) -> None:
        """A cycle's claims were undone by a limit (a pool full, a rate, a flow's
        ``max_running``) at ``now`` (monotonic seconds): claim none ahead for the next
        :data:`WINDOW`. A claim held ahead holds its pool's seat too, so claiming ahead
        of a full pool only turns claims into waiters to be woken again."""
        self._off_until = now + WINDOW

    def target(self, now: float, ends: int) -> int:
        """How many instances to hold claimed ahead at ``now``."""
        if self.limit <= 0 or now < self._off_until:
            return 0
        if now - self._mark_at >= WINDOW:
            # a window is over (if more than one passed, the previous held no end)
            self._previous = ends - self._mark if now - self._mark_at < 2 * WINDOW else 0
            self._mark_at, self._mark = now, ends
        return min(self.limit, max(self._previous, ends - self._mark))
