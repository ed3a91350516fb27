"""Finished attempts wait a moment for company, so that one cycle commits many.

A cycle costs about the same for one outcome as for ten (the transaction, the commit,
the claim query; each outcome adds a row or two). When handlers end one at a time, as
``exec`` handlers do (each exit is its own event), a worker that started a cycle for
every exit would commit about two outcomes a cycle and spend half its loop in SQLite
(``docs/performance.md``, "Batches while nearly full"). So while the worker is nearly
full (fewer than :attr:`Hold.batch` free slots: more attempts are about to end) a
finished attempt waits up to :data:`HOLD_MAX` seconds for others before its cycle starts.
A worker with room to spare (little due work, or idle) never waits: it adds no latency
there.
"""

from __future__ import annotations

#: The longest the first finished attempt of a batch waits for others (seconds).
HOLD_MAX = 0.008


class Hold:
    """When the next cycle of a worker of ``concurrency`` slots may start.

    ``batch`` is the number of free slots from which a cycle starts at once
    (a quarter of the slots, at least one); ``since`` is when the current wait began
    (monotonic seconds; ``None``: nothing is held).
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.batch = max(1, concurrency // 4)
        self.since: float | None = None

    def wait(self, now: float, running: int) -> float:
        """Seconds the cycle that is wanted now should still wait (0: start it now),
        with ``running`` attempts still running at ``now`` (monotonic seconds; pass 0
        when the worker must not wait, e.g. while stopping)."""
        if running == 0 or self.concurrency - running >= self.batch:
            self.since = None
            return 0.0
        if self.since is None:
            self.since = now
        left = self.since + HOLD_MAX - now
        if left <= 0:
            self.since = None
            return 0.0
        return left

    def reset(self) -> None:
        """Nothing is held any more (a cycle started, or none is wanted)."""
        self.since = None

    def left(self, now: float) -> float:
        """Seconds until a wait begun at :attr:`since` is over (``inf`` if none)."""
        return float("inf") if self.since is None else max(0.0, self.since + HOLD_MAX - now)
