"""The sensor hub's file watcher and flow hot reload.

One watcher per daemon covers the flows folder and every folder a sensor needs (files
folders, the folders of tailed logs); it is restarted when that set changes. On Linux it
is inotify read by the event loop (``runner.sensors.inotify``: nothing runs while nothing
changes); elsewhere, or when polling is asked for, ``watchfiles.awatch``.
A change in the flows folder reloads that flow file (``FlowRegistry.reload``: a bad edit
is reported and the good version kept), records its new version and restarts its
sensors; a change in a sensor's folder goes to that sensor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from watchfiles import awatch

from runner.flowspec.registry import SUFFIXES
from runner.sensors import inotify
from runner.sensors.base import FileChange, first_of, log
from runner.sensors.files import FilesSensor
from runner.store import create, inotify_sys

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.sensors.hub import SensorHub


class FlowWatch:
    """The watcher and flow reload of one :class:`runner.sensors.hub.SensorHub`.

    ``await watch.run(stop)`` watches until ``stop`` is set; a failure ends it (the hub's
    ``keep`` restarts it, and the restart rescans what changed meanwhile and retries a
    flow reload that failed).

    Attributes:
        watching: set once the watcher runs (the hub's sensors scan only then, or a file
            dropped in between would be missed); also set when it failed, so that
            readiness is never held up.
        restart: set to restart the watcher (the set of folders to watch changed).
        folders: the folders watched now (outermost only: the watch is recursive).
    """

    def __init__(self, hub: SensorHub) -> None:
        self.hub = hub
        self.watching = asyncio.Event()
        self.restart = asyncio.Event()
        self.folders: tuple[Path, ...] = ()
        self._pending: set[str] = set()  # flow files whose reload the database refused
        self._unrecorded: set[str] = set()  # reloaded flows whose version is not stored yet

    def _wanted(self) -> tuple[Path, ...]:
        """The flows folder plus every sensor folder, outermost only (the watch is
        recursive), created when missing."""
        folders = {Path(self.hub.registry.folder).absolute()}
        for name, (flow, spec) in self.hub.desired().items():
            sensor = self.hub.make_sensor(name, flow, spec)
            folders.update(sensor.folders())
        out: list[Path] = []
        for folder in sorted(folders, key=lambda p: len(p.parts)):
            if not any(folder == o or o in folder.parents for o in out):
                out.append(folder)
        for folder in out:
            folder.mkdir(parents=True, exist_ok=True)
        return tuple(sorted(out))

    def _polling(self) -> bool | None:
        if self.hub.force_polling is not None:
            return self.hub.force_polling
        if any(
            spec.kind == "files" and spec.files.force_polling
            for _, spec in self.hub.desired().values()
        ):
            return True
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop``; a failure ends it (``keep`` restarts it, and the restart
        rescans what changed meanwhile and retries a flow reload that failed)."""
        while not stop.is_set():
            self.restart.clear()
            try:
                await self._watch_once(stop)
            finally:
                self.watching.set()  # never hold up readiness with a failed watcher

    async def _watch_once(self, stop: asyncio.Event) -> None:
        self.folders = self._wanted()
        quit_watch = asyncio.Event()
        relayed = asyncio.ensure_future(relay(quit_watch, stop, self.restart))
        polling = self._polling()
        if not polling and inotify_sys.available():  # no thread, no wake-up while idle
            changes = inotify.changes(
                self.folders, debounce=self.hub.debounce, step=self.hub.step, stop=quit_watch
            )
        else:
            changes = awatch(
                *self.folders,
                watch_filter=None,
                debounce=self.hub.debounce,
                step=self.hub.step,
                stop_event=quit_watch,
                force_polling=polling,
                recursive=True,
            )
        nxt = asyncio.ensure_future(anext(changes))
        try:
            # The watcher exists once the generator ran its first step; only then may
            # sensors scan, or a file dropped in between would be missed.
            for _ in range(3):
                await asyncio.sleep(0)
            if nxt.done() and nxt.exception() is not None:
                raise nxt.exception()  # type: ignore[misc]
            if self.watching.is_set():  # a restart: what changed meanwhile is rescanned
                for sensor in self.hub.held_sensors():
                    if isinstance(sensor, FilesSensor):
                        sensor.request_scan()
                    else:
                        sensor.kick()
            self.watching.set()
            # flow files edited since they were read (before this watcher existed: at the
            # first start, after the daemon's load; or while it restarted) and reloads
            # the database refused before
            missed = self._pending.union(self.hub.registry.stale())
            if missed:
                await self._reload(sorted(missed))
            log.debug("watching %s", ", ".join(map(str, self.folders)))
            while True:
                try:
                    batch = await nxt
                except StopAsyncIteration:
                    return
                nxt = asyncio.ensure_future(anext(changes))
                await self._dispatch(sorted(batch, key=lambda c: (c[1], c[0])))
        finally:
            quit_watch.set()
            relayed.cancel()
            nxt.cancel()
            with contextlib.suppress(BaseException):
                await nxt
            await changes.aclose()

    async def _dispatch(self, batch: list[FileChange]) -> None:
        flows_dir = Path(self.hub.registry.folder).absolute()
        reload = {p for _, p in batch if Path(p).parent == flows_dir and Path(p).suffix in SUFFIXES}
        for sensor in self.hub.held_sensors():
            prefixes = [str(f) + os.sep for f in sensor.folders()]
            mine = [c for c in batch if c[1].startswith(tuple(prefixes))]
            if mine:
                sensor.on_changes(mine)
        if reload:
            await self._reload(sorted(reload))

    async def _reload(self, paths: list[str]) -> None:
        """Reload edited flow files; record new versions; restart their sensors.

        When the database refuses the new versions, the paths are kept and reloaded
        again when the watcher restarts (the error propagates to ``keep``)."""
        self._pending.update(paths)
        before = {name: flow.version for name, flow in self.hub.registry.flows.items()}
        for error in self.hub.registry.reload(paths):
            log.error("flow not reloaded: %s", error)
        changed = [f for n, f in self.hub.registry.flows.items() if before.get(n) != f.version]
        self._unrecorded.update(f.name for f in changed)
        pending = [f for n, f in self.hub.registry.flows.items() if n in self._unrecorded]
        if pending:
            await asyncio.to_thread(record_versions, self.hub.engine, pending)
            self._unrecorded.clear()
            for flow in changed:
                log.info("flow %s reloaded (version %s)", flow.name, flow.version)
        self._pending.difference_update(paths)
        for name in sorted(set(before) - set(self.hub.registry.flows)):
            log.info("flow %s removed", name)
        await self.hub.leases()
        if self._wanted() != self.folders:
            self.restart.set()


def record_versions(engine: Engine, flows: list[CompiledFlow]) -> None:
    """Record the versions of ``flows`` (one transaction)."""
    with engine.begin() as conn:
        for flow in flows:
            create.record_version(conn, flow)


async def relay(out: asyncio.Event, *events: asyncio.Event) -> None:
    """Set ``out`` once any of ``events`` is set."""
    await first_of(*(e.wait() for e in events))
    out.set()
