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


def batch_size(concurrency: int) -> int:
    """The free slots from which a cycle starts at once: a quarter of ``concurrency``,
    at least one."""
    return max(1, concurrency // 4)


def held(since: float | None, now: float, running: int, concurrency: int) -> float | None:
    """When the current wait for a batch began (monotonic seconds), or ``None`` when the
    cycle wanted at ``now`` should start now: ``running`` of ``concurrency`` slots are
    busy (pass 0 when the worker must not wait, e.g. while stopping), ``since`` is when
    the wait began (``None``: none yet)."""
    if running == 0 or concurrency - running >= batch_size(concurrency):
        return None
    if since is None:
        since = now
    return None if since + HOLD_MAX - now <= 0 else since


class Hold:
    """When the next cycle of a worker of ``concurrency`` slots may start.

    ``batch`` is the number of free slots from which a cycle starts at once
    (:func:`batch_size`); ``since`` is when the current wait began
    (monotonic seconds; ``None``: nothing is held).
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.batch = batch_size(concurrency)
        self.since: float | None = None

    def wait(self, now: float, running: int) -> float:
        """Seconds the cycle that is wanted now should still wait (0: start it now),
        with ``running`` attempts still running at ``now`` (monotonic seconds; pass 0
        when the worker must not wait, e.g. while stopping)."""
        self.since = held(self.since, now, running, self.concurrency)
        return 0.0 if self.since is None else self.since + HOLD_MAX - now

    def reset(self) -> None:
        """Nothing is held any more (a cycle started, or none is wanted)."""
        self.since = None

    def left(self, now: float) -> float:
        """Seconds until a wait begun at :attr:`since` is over (``inf`` if none)."""
        return float("inf") if self.since is None else max(0.0, self.since + HOLD_MAX - now)
