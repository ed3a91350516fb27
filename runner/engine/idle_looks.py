"""An idle SQLite worker's looks for due work, skipped while nobody commits.

Before an idle look the worker reads SQLite's change counter (``PRAGMA data_version``,
``runner.store.data_version``): while it has not moved since a look found nothing due,
the look would find nothing either and is skipped (a due time that look planned wakes
the loop anyway). On Linux the loop does not even poll the counter: every commit writes
the file's ``-wal``, an inotify watch on it (the commit bell) is read by the event loop
while the looks are skipped, and its ring makes the next look due at once
(``docs/performance.md``, "Idle looks skipped"). PostgreSQL workers are woken by
notifications instead and do not use this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine

from runner.engine.timers import LoopingTimer
from runner.store.data_version import CommitBell, DataVersion, commit_bell, data_version

#: Seconds between two looks for due work while an idle SQLite worker waits for its
#: commit bell (a safety net: a commit rings the bell at once).
BELL_FALLBACK = 1.0
#: After a ring, the counter is read again this soon (seconds), then at doubling waits up
#: to :data:`RECHECK_LAST`: a commit rings the bell as it writes its frames to the
#: ``-wal``, a moment before it counts them in the WAL index; a look at the ring may find
#: the counter unmoved, and a committer descheduled in between (a busy machine) publishes
#: its commit ms later, with no ring of its own. Without the rechecks such work waited
#: for the next commit or the fallback (53 ms p99 with 20 handlers writing at full speed).
RECHECK_FIRST = 0.001
RECHECK_LAST = 0.128


@dataclass
class Skip:
    """When one kind of look is skipped: while the change counter stays where it was
    when the last such look found nothing.

    Attributes:
        quiet: the counter when a look last found nothing (looks skipped while equal).
        probing: the counter when the look in flight began.
    """

    quiet: int | None = None
    probing: int | None = None

    def unchanged(self, changes: DataVersion | None) -> bool:
        """True when nothing was committed (by anyone) since a look found nothing: this
        look would find nothing either. Otherwise the counter is noted for the look
        about to start (:meth:`looked`)."""
        if changes is None:
            return False
        seen = changes.read()
        if seen is not None and seen == self.quiet:
            return True
        self.quiet, self.probing = None, seen
        return False

    def looked(self, found: bool) -> None:
        """The look in flight came back: when it ``found`` nothing, skip the next ones."""
        if self.probing is not None:
            if not found:
                self.quiet = self.probing
            self.probing = None


@dataclass
class IdleLooks:
    """The skip state of one worker's idle looks (off on PostgreSQL or when the counter
    cannot be read: then no look is ever skipped).

    Attributes:
        changes: the change counter's reader.
        bell: the commit bell (Linux), or ``None``.
        due: the looks for due work.
        recover: the looks for lost attempts; one finds nothing when nothing is locked,
            held or waiting (``leases.may_recover``, which reads only what commits change:
            no lease to lapse, no holder to die).
        listening: the loop reads the bell now.
        recheck: seconds until the next read of the counter after the last ring
            (:data:`RECHECK_FIRST`, doubling), ``None`` once past :data:`RECHECK_LAST`.
    """

    changes: DataVersion | None = None
    bell: CommitBell | None = None
    due: Skip = field(default_factory=Skip)
    recover: Skip = field(default_factory=Skip)
    listening: bool = False
    recheck: float | None = None

    @classmethod
    def open(cls, engine: Engine) -> IdleLooks:
        """The counter (and bell) of ``engine``'s SQLite file; inactive elsewhere."""
        changes = data_version(engine)
        return cls(changes, commit_bell(engine) if changes is not None else None)

    @property
    def active(self) -> bool:
        """True when looks may be skipped (a SQLite file whose counter can be read)."""
        return self.changes is not None

    def unchanged(self) -> bool:
        """True when a look for due work would find nothing (:meth:`Skip.unchanged`)."""
        return self.due.unchanged(self.changes)

    def recover_unchanged(self) -> bool:
        """True when a look for lost attempts would find nothing (:meth:`Skip.unchanged`)."""
        return self.recover.unchanged(self.changes)

    def may_find(self, probe: LoopingTimer, now: float) -> bool:
        """A look for due work that is due (``probe``, the worker's idle-look timer) may
        find something: False while nobody committed since the last look found nothing
        (``probe`` is then set to the next look: when the bell rings, or the next poll).
        (Read before ``pacing.plan`` decides: the skip is only active on SQLite, where no
        second cycle is ever in flight.)"""
        if self.unchanged():
            probe.next_at = now + self.next_look(probe.interval)
            return False
        return True

    def held_nothing(self, recover: LoopingTimer, now: float) -> bool:
        """A look for lost attempts that is due (``recover``, its timer) would find
        nothing: True while nobody committed since the last found nothing locked, held or
        waiting (the timer restarted); an idle daemon then reads only the change counter
        each second."""
        if self.recover_unchanged():
            recover.restart(now)
            return True
        return False

    def next_look(self, interval: float) -> float:
        """Seconds until the next look while skipping: the next recheck after a ring
        (:meth:`take_recheck`), else ``BELL_FALLBACK`` while the bell is read, else the
        worker's poll ``interval``."""
        recheck = self.take_recheck()
        if recheck is not None:
            return recheck
        return BELL_FALLBACK if self.listening else interval

    def take_recheck(self) -> float | None:
        """Seconds until the counter is to be read again after the last ring (the wait
        after it doubles), or ``None`` when no recheck is left."""
        wait = self.recheck
        if wait is not None:
            self.recheck = wait * 2 if wait < RECHECK_LAST else None
        return wait

    def looked(
        self,
        found: bool,
        nothing_held: bool,
        loop: asyncio.AbstractEventLoop | None,
        rung: Callable[[], None],
    ) -> None:
        """A cycle came back: when the look for due work in flight ``found`` nothing, or
        the look for lost attempts found ``nothing_held``, skip the next ones; read the
        bell (calling ``rung`` at a ring) exactly while looks for due work are skipped."""
        self.due.looked(found)
        self.recover.looked(not nothing_held)
        self.listen(self.due.quiet is not None, loop, rung)

    def listen(
        self, on: bool, loop: asyncio.AbstractEventLoop | None, rung: Callable[[], None]
    ) -> None:
        """Read the commit bell from ``loop`` (``on``) or stop reading it."""
        bell = self.bell
        if bell is None or loop is None or on == self.listening:
            return
        if on:
            loop.add_reader(bell.fd, self.ring, rung)
        else:
            loop.remove_reader(bell.fd)
        self.listening = on

    def ring(self, rung: Callable[[], None]) -> None:
        """The bell rang (a commit, anyone's): drain it, recheck the counter from
        :data:`RECHECK_FIRST` on, and call ``rung``."""
        if self.bell is not None:
            self.bell.drain()
        self.recheck = RECHECK_FIRST
        rung()

    def close(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Stop reading the bell and close the counter's connection and the bell."""
        self.listen(False, loop, lambda: None)
        for closing in (self.changes, self.bell):
            if closing is not None:
                closing.close()
