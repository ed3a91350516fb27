"""What a running daemon says about its progress.

- ``--exit-when-idle`` on a terminal: a live rich progress bar (done/total, rate, ETA);
  without a terminal, one progress line every ``every`` seconds (:func:`progress_loop`).
- Every daemon: one status line a minute (counts by status, attempts/s) (:func:`status_loop`),
  and a last line saying what its worker did (:func:`closing_line`).

"Done" counts instances that reached a final status (completed, failed, killed) since the
daemon started; "total" adds the instances that are not final yet. Both come from one
grouped count (``queries.count_by_status``, over an index) per refresh, on a thread. The
baseline (what was final already) is counted before the worker's first claim
(:func:`baseline`): attempts that end in its first cycles, before the progress line
starts, count as done.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from runner.ops.queries import count_by_status

log = logging.getLogger("flowrun.daemon")

FINAL = ("completed", "failed", "killed")


class Progress:
    """Done/total since a baseline, with a rate and an ETA (seconds)."""

    def __init__(self, counts: dict[str, int], now: float) -> None:
        self.base = sum(counts.get(s, 0) for s in FINAL)
        self.started = now
        self.done = 0
        self.total = 0
        self.counts = counts

    def update(self, counts: dict[str, int]) -> None:
        """Take a fresh ``count_by_status`` result."""
        self.counts = counts
        final = sum(counts.get(s, 0) for s in FINAL)
        self.done = max(0, final - self.base)
        self.total = self.done + sum(n for s, n in counts.items() if s not in FINAL)

    def rate(self, now: float) -> float:
        """Instances finished per second since the start."""
        return self.done / max(now - self.started, 1e-9)

    def eta(self, now: float) -> float | None:
        """Seconds left at the current rate (``None`` while nothing finished)."""
        rate = self.rate(now)
        return (self.total - self.done) / rate if rate > 0 else None

    def line(self, now: float) -> str:
        """``progress: 5/12 done, 1.2/s, ETA 6s``."""
        eta = self.eta(now)
        left = f"ETA {eta:.0f}s" if eta is not None else "ETA ?"
        return f"progress: {self.done}/{self.total} done, {self.rate(now):.1f}/s, {left}"


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def closing_line(stats: Any) -> str:
    """The daemon's last line, in a user's words, from its worker's ``WorkerStats``:
    ``done: 8 attempts committed (1 cancelled), 5 instances claimed, 3 attempts run on
    in the next state without a new claim, ...``; the counts that are 0 after the first
    two are left out."""
    parts = [
        _n(stats.committed, "attempt committed", "attempts committed")
        + (f" ({stats.cancelled} cancelled)" if stats.cancelled else ""),
        _n(stats.claimed, "instance claimed", "instances claimed"),
    ]
    if stats.chained:
        parts.append(
            _n(stats.chained, "attempt", "attempts")
            + " run on in the next state without a new claim"
        )
    if stats.handed:
        parts.append(
            _n(stats.handed, "pool seat", "pool seats")
            + " handed from an ended attempt to a standby claim"
        )
    if stats.lost_fence:
        parts.append(
            _n(stats.lost_fence, "outcome", "outcomes")
            + " not committed (the instance was taken away by a command or another worker)"
        )
    if stats.recovered:
        parts.append(
            _n(stats.recovered, "attempt", "attempts") + " of dead workers recorded as lost"
        )
    return "done: " + ", ".join(parts)


async def _counts(engine: Engine) -> dict[str, int]:
    return await asyncio.to_thread(count_by_status, engine)


async def baseline(engine: Engine) -> dict[str, int]:
    """The instance counts by status before the worker's first claim (on a thread), for
    :func:`progress_loop`. Raises SQLAlchemy's ``DBAPIError`` when the database fails."""
    return await _counts(engine)


async def progress_loop(
    engine: Engine,
    stop: asyncio.Event,
    *,
    tty: bool | None = None,
    every: float = 5.0,
    base: dict[str, int] | None = None,
) -> None:
    """Show progress until ``stop``: a rich bar on a terminal (stderr), else a log line
    every ``every`` seconds. ``base`` is :func:`baseline`'s counts, taken before the
    worker's first claim (``None``: counted now). A database error propagates (the
    supervisor retries)."""
    tty = sys.stderr.isatty() if tty is None else tty
    prog = Progress(base if base is not None else await _counts(engine), time.monotonic())
    if not tty:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), every)
            except TimeoutError:
                pass
            prog.update(await _counts(engine))
            log.info(prog.line(time.monotonic()))
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bar

    with Bar(
        TextColumn("flowrun"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]:.1f}/s"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as bar:
        # log lines go through rich's redirected stderr, printed above the live bar
        handlers = [
            h for h in logging.getLogger("flowrun").handlers if isinstance(h, logging.StreamHandler)
        ]
        streams = [h.stream for h in handlers]
        for h in handlers:
            h.setStream(sys.stderr)
        task = bar.add_task("instances", total=None, rate=0.0)
        try:
            while True:
                prog.update(await _counts(engine))
                rate = prog.rate(time.monotonic())
                bar.update(task, completed=prog.done, total=prog.total or None, rate=rate)
                if stop.is_set():
                    break
                try:
                    await asyncio.wait_for(stop.wait(), 0.5)
                except TimeoutError:
                    pass
        finally:
            for h, stream in zip(handlers, streams, strict=True):
                h.setStream(stream)


async def status_loop(
    engine: Engine,
    stats: Callable[[], Any],
    stop: asyncio.Event,
    every: float = 60.0,
) -> None:
    """Log one status line every ``every`` seconds: instance counts by status and the
    attempts committed per second since the last line (``stats()`` returns the worker's
    ``committed`` count)."""
    last_n, last_t = stats(), time.monotonic()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except TimeoutError:
            pass
        counts = await _counts(engine)
        n, t = stats(), time.monotonic()
        rate = (n - last_n) / max(t - last_t, 1e-9)
        last_n, last_t = n, t
        shown = ", ".join(f"{s} {counts[s]}" for s in sorted(counts) if counts[s])
        log.info("status: %s; %.1f attempts/s", shown or "no instances", rate)
