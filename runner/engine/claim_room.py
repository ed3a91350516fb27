"""How much a worker's next cycle claims: its free slots, the claims it holds ahead of
them (``ahead.ClaimAhead``), the standbys it may ask for (``seats``), and whether the
claim may be split over two cycles in flight (``pacing.FILLED_FOR``). The worker loop
(``worker.Worker``) asks once a turn and tells it what each cycle's claim met.
"""

from __future__ import annotations

from runner.engine.ahead import ClaimAhead
from runner.engine.cycle import CycleRequest, CycleResult
from runner.engine.pacing import FILLED_FOR
from runner.engine.running import Running, RunningAttempts
from runner.engine.seats import budget


class ClaimRoom:
    """The claim's size for the worker whose attempts are ``attempts``, claiming at most
    ``prefetch`` ahead of its free slots (``0``: never). Times are monotonic seconds."""

    __slots__ = ("ahead", "attempts", "_ahead_now", "_filled_until")

    def __init__(self, attempts: RunningAttempts, prefetch: int) -> None:
        self.attempts = attempts
        self.ahead = ClaimAhead(prefetch)
        self._ahead_now = 0  # the claim-ahead target at the last :meth:`room`
        self._filled_until = 0.0  # a claim filled a pool: no split claim before then

    def room(
        self, now: float, free: int, claiming: int, stopping: bool
    ) -> tuple[int, list[Running]]:
        """``(room, release)`` at ``now``: how many instances the next cycle may claim
        (``free`` slots and claims to hold ahead of them, less those waiting and the
        ``claiming`` of the cycles in flight), and the waiting claims to give back
        (``running.Running``): all of them while ``stopping``, else those not started
        within ``ahead.WAIT_MAX`` (then no claim ahead in that cycle)."""
        a = self.attempts
        self._ahead_now = 0
        if stopping:
            return 0, a.give_back(everything=True) if a.waiting or a.standby or a.lapsed else []
        if a.overdue():
            return max(0, free - claiming), a.give_back()
        ahead = self._ahead_now = self.ahead.target(now, a.ends)
        held = len(a.waiting) + len(a.standby)
        return max(0, free + ahead - held - claiming), []

    def ask_standbys(self, request: CycleRequest) -> None:
        """Let ``request`` (claiming ``request.free``) make standbys (``engine.seats``):
        only while the worker claims ahead, at most as many as it claims ahead."""
        if request.free > 0 and self._ahead_now > 0:
            a = self.attempts
            request.standby = budget(a.running.values(), a.standby.values())
            request.standby_most = self._ahead_now - len(a.standby)

    def met(self, result: CycleResult, now: float) -> None:
        """What a cycle's claim met at ``now``: limits that refused claims (no claim
        ahead for a while), a pool it filled (no split claim for ``FILLED_FOR``)."""
        if result.refused:
            self.ahead.refused(now)
        if result.filled:
            self._filled_until = now + FILLED_FOR

    def filled(self, now: float) -> bool:
        """A claim filled a pool or a flow limit within ``pacing.FILLED_FOR`` of ``now``."""
        return now < self._filled_until
