"""The deadline watch: a part of every daemon's sensor hub that acts on missed deadlines.

It sleeps until the earliest ``deadline_at`` of any instance
(``runner.store.deadlines.next_due``: one read of a partial index), then acts on the
instances due (``runner.ops.deadlines.fire_due``: moves, events, command rows, in one
transaction; on PostgreSQL daemons take different rows). A deadline set meanwhile by
any process (a new instance, a move) is seen at the next look, at most
:data:`LOOK_EVERY` seconds later; on SQLite a look is only a read of the file's change
counter while nobody commits. While no loaded flow has a deadline it reads nothing.
Pending deadlines do not keep ``--exit-when-idle`` from exiting: a deadline is not work
due now.

Each deadline missed is one WARNING line (``runner.warn_line``, kind
``deadline_missed``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import Engine

from runner.ops.deadlines import fire_due
from runner.sensors.base import first_of, log
from runner.store.clock import clock_of
from runner.store.data_version import data_version
from runner.store.deadlines import next_due
from runner.warn_line import warn

#: Longest sleep between two looks for the earliest deadline, seconds, while a loaded
#: flow has deadlines (deadlines set by other processes are seen this soon).
LOOK_EVERY = 0.5
#: Shortest sleep between two looks, seconds.
MIN_WAIT = 0.02
#: Sleep between looks at the flows while none has a deadline, seconds.
IDLE_EVERY = 5.0


class DeadlineWatch:
    """Acts on the deadlines due, in one daemon.

    Args:
        engine: the database.
        registry: the ``FlowRegistry`` (whether any loaded flow has a deadline).
        worker_id: this daemon's id (the ``worker`` of the lifecycle events).

    Attributes:
        on_missed: called (in the loop) after deadlines were acted on: the rules and the
            worker have work.
        missed: deadlines acted on by this daemon (metrics, tests).
    """

    def __init__(self, engine: Engine, registry: Any, worker_id: str) -> None:
        self.engine = engine
        self.registry = registry
        self.worker_id = worker_id
        self.on_missed: Any = None
        self.missed = 0
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Look for the earliest deadline now (a deadline may have been set)."""
        self._kick.set()

    def wanted(self) -> bool:
        """Whether a loaded flow has a deadline."""
        return any(getattr(f, "has_deadlines", False) for f in self.registry.flows.values())

    async def run(self, stop: asyncio.Event) -> None:
        """Act on deadlines until ``stop``; a database error ends it (``keep`` restarts
        it).

        On SQLite a look is skipped while nobody committed anything since the last one
        (``runner.store.data_version``) and the earliest deadline it found has not come:
        it would find what that one found."""
        changes = data_version(self.engine)
        clock = clock_of(self.engine)  # deadlines are judged by the database's clock
        seen: int | None = None  # the data version the last look read
        due: float | None = None  # the earliest deadline it found
        try:
            while not stop.is_set():
                self._kick.clear()
                if not self.wanted():
                    await first_of(self._kick.wait(), stop.wait(), timeout=IDLE_EVERY)
                    continue
                version = changes.read() if changes is not None else None
                now = clock.now()
                if version is None or version != seen or (due is not None and due <= now):
                    if await self._look():
                        continue
                    seen = version
                    due = await asyncio.to_thread(next_due, self.engine)
                wait = LOOK_EVERY if due is None else min(LOOK_EVERY, due - clock.now())
                # at least MIN_WAIT: the clock's offset may be off by its error (a reading's
                # half round trip), a moment longer
                wait = max(wait, MIN_WAIT)
                await first_of(self._kick.wait(), stop.wait(), timeout=wait)
        finally:
            if changes is not None:
                changes.close()

    async def _look(self) -> bool:
        """Act on the deadlines due now; True when some were."""
        missed = await asyncio.to_thread(fire_due, self.engine, self.worker_id)
        for m in missed:
            self.missed += 1
            text = f"deadline missed: {m.text}"
            warn(log, m.instance, m.flow, m.state, "deadline_missed", text)
        if missed and self.on_missed is not None:
            self.on_missed()
        return bool(missed)
