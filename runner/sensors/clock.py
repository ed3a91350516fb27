"""Clock sensors: ``every: 5m`` and ``cron: "0 3 * * *"`` (cron in the host's local time).

The cursor holds the last tick fired (``{"last": epoch seconds}``). Ticks missed while no
daemon ran fire ONCE on start-up (the latest missed one), not once per missed tick. The
first start of a sensor with no cursor fires nothing: its first tick is the next one.
Event key: the tick in ISO 8601 UTC, so a tick is stored once whichever daemon fires it.
Payload: ``{"tick": ISO 8601 UTC, "scheduled": epoch seconds, "missed": bool}``.

Ticks are judged by the database's clock (``runner.store.clock``; SQLite: the local
one): the sensor's lease may move to another host, and a host whose clock is off must
fire a tick neither early nor late, nor start a fresh sensor's ticks off that host's
time.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from runner.ops.views import iso
from runner.sensors.base import Sensor
from runner.sensors.events import load_cursor
from runner.store.clock import clock_of

#: Longest single sleep in seconds (re-reads the clock after suspends or clock jumps).
MAX_SLEEP = 60.0


class ClockSensor(Sensor):
    """Fire at ``spec.every`` seconds after the last tick, or at each ``spec.cron`` time."""

    def next_tick(self, after: float) -> float:
        """The first tick strictly after ``after`` (epoch seconds)."""
        if self.spec.cron:
            from croniter import croniter  # only cron sensors pay for its import (~8 ms)

            return croniter(self.spec.cron, _local(after)).get_next(float)
        return after + float(self.spec.every)

    def last_tick(self, at: float, last: float) -> float | None:
        """The latest tick in ``(last, at]``, or ``None`` when there is none."""
        if self.spec.cron:
            from croniter import croniter

            tick = croniter(self.spec.cron, _local(at + 0.001)).get_prev(float)
            return tick if tick > last else None
        every = float(self.spec.every)
        if at < last + every:
            return None
        return last + every * int((at - last) // every)

    async def run(self, stop: asyncio.Event) -> None:
        clock = clock_of(self.engine)  # the database's clock, as the sensor's lease
        cursor = await asyncio.to_thread(load_cursor, self.engine, self.name)
        now = clock.now()
        last = cursor.get("last")
        if last is None:
            last = now
            await self.store([], {"last": last})
        else:
            missed = self.last_tick(now, float(last))
            if missed is not None:
                last = missed
                await self._fire(missed, missed=True)
        self.started.set()
        while not stop.is_set():
            due = self.next_tick(float(last))
            wait = due - clock.now()
            if wait > 0:
                await self._wait(stop, min(wait, MAX_SLEEP))
                continue
            tick = self.last_tick(clock.now(), float(last)) or due  # at most one catch-up
            last = tick
            await self._fire(tick, missed=tick > due)

    async def _fire(self, tick: float, *, missed: bool) -> None:
        when = iso(tick)
        payload: dict[str, Any] = {"tick": when, "scheduled": tick, "missed": missed}
        await self.store([(when or "", payload)], {"last": tick})


def _local(ts: float) -> datetime:
    return datetime.fromtimestamp(ts).astimezone()
