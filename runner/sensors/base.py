"""What every sensor shares: its name, its flow, where it stores events, how it is woken."""

from __future__ import annotations

import asyncio
import logging
import socket
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from runner.sensors.events import record_events

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

log = logging.getLogger("flowrun.sensors")

#: One file-system change from the watcher: (``watchfiles.Change``, absolute path).
FileChange = tuple[Any, str]


class Sensor(ABC):
    """Base of the files, tail and clock sensors.

    Args:
        engine: the database.
        name: ``"<flow>.<sensor>"`` (the ``sensors``/``events`` name).
        flow: the ``CompiledFlow`` declaring the sensor (paths resolve against its folder).
        spec: the sensor's ``SensorSpec``.
        worker_id: this daemon's id (the lease holder that fences cursor writes).
        on_events: called (in the event loop) after events were stored, to wake the rules.
    """

    def __init__(
        self,
        engine: Engine,
        name: str,
        flow: CompiledFlow,
        spec: Any,
        worker_id: str,
        on_events: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.name = name
        self.flow = flow
        self.spec = spec
        self.worker_id = worker_id
        self.on_events = on_events
        #: the daemon's ``host`` label (``runner.labels``), put in files and tail events
        self.host = socket.gethostname()
        #: Set once start-up reconciliation is stored (existing files, tail backlog,
        #: a missed clock tick).
        self.started = asyncio.Event()
        #: Events stored, by sensor name (the hub's shared counter, for metrics).
        self.tally: Counter[str] = Counter()
        self._kick = asyncio.Event()

    def resolve(self, path: str) -> Path:
        """``path`` made absolute against the flow file's folder (normalised, no symlinks)."""
        base = Path(str(self.flow.path)).parent if getattr(self.flow, "path", None) else Path()
        return Path(base, path).expanduser().absolute()

    def folders(self) -> list[Path]:
        """Folders this sensor needs watched (none for clocks)."""
        return []

    def on_changes(self, changes: Sequence[FileChange]) -> None:
        """Take the watcher's changes under :meth:`folders` (called in the event loop)."""
        self.kick()

    def kick(self) -> None:
        """Wake the sensor's loop now."""
        self._kick.set()

    def busy(self) -> bool:
        """True while something seen is not stored yet (e.g. a file still settling)."""
        return False

    @abstractmethod
    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile, set :attr:`started`, then emit events until ``stop`` is set."""

    async def _wait(self, stop: asyncio.Event, timeout: float) -> None:
        """Sleep until kicked, stopped, or ``timeout`` seconds passed; clear the kick."""
        if not self._kick.is_set() and not stop.is_set():
            await first_of(self._kick.wait(), stop.wait(), timeout=max(timeout, 0.0))
        self._kick.clear()

    async def store(
        self,
        rows: Sequence[tuple[str, dict[str, Any]]],
        cursor: dict[str, Any] | None = None,
    ) -> None:
        """Store ``(key, payload)`` events (and the cursor, fenced by the lease) in one
        transaction, off the event loop; then wake the rules."""
        if not rows and cursor is None:
            return
        await asyncio.to_thread(
            record_events, self.engine, self.name, rows, cursor=cursor, worker_id=self.worker_id
        )
        if rows:
            self.tally[self.name] += len(rows)
            self.on_events()


async def first_of(*aws: Any, timeout: float | None = None) -> None:
    """Wait until the first of the awaitables finishes (or ``timeout`` seconds pass);
    cancel the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
