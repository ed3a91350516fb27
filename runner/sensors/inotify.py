"""The sensor hub's file watcher on Linux: the kernel's inotify, read by the event loop.

``watchfiles`` runs a thread that sleeps ``step`` milliseconds at a time and takes the GIL
after each sleep to look for a stop request: 200 wake-ups a second at the hub's 5 ms step,
the largest cost of an idle daemon. :func:`changes` gives the same batches (sets of
``(watchfiles.Change, path)``, after a quiet ``step`` or at most ``debounce``
milliseconds) from an inotify descriptor the event loop watches (``add_reader``): no
thread, and no wake-up at all while nothing changes.

What the kernel reports maps as ``watchfiles`` maps it: created or moved in → ``added``;
deleted or moved out → ``deleted``; written or its attributes changed → ``modified``.
Watches are recursive: every folder under a watched one is watched, and a folder created
or moved in later is watched at once. A queue overflow (events lost) raises
:class:`Overflow`: the hub restarts its watcher, which rescans what the sensors watch.
Elsewhere (not Linux), or when polling is asked for, the hub uses ``watchfiles``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import AsyncGenerator, Iterable
from pathlib import Path
from typing import Any

from watchfiles import Change

from runner.sensors.base import first_of
from runner.store.inotify_sys import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    add_watch,
    drain,
    open_fd,
)

MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, NUL-padded)


class Overflow(RuntimeError):
    """The kernel's event queue overflowed: changes were lost (rescan)."""


class Inotify:
    """One inotify descriptor watching ``folders`` (absolute paths) recursively.

    Raises ``OSError`` when inotify cannot be set up (e.g. the per-user watch limit,
    ``fs.inotify.max_user_watches``). :meth:`read` returns what happened since the last
    read; :meth:`close` when done.
    """

    def __init__(self, folders: Iterable[Path]) -> None:
        self.fd = open_fd()
        self.dirs: dict[int, str] = {}
        try:
            for folder in folders:
                self._add_tree(str(folder))
        except BaseException:
            self.close()
            raise

    def _add(self, path: str) -> None:
        self.dirs[add_watch(self.fd, path, MASK)] = path

    def _add_tree(self, root: str, *, strict: bool = True) -> None:
        """Watch ``root`` and every folder under it; with ``strict`` False a folder that
        vanished meanwhile is skipped."""
        try:
            self._add(root)
        except FileNotFoundError:
            if strict:
                raise
            return
        for dirpath, dirnames, _ in os.walk(root):
            for name in dirnames:
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    self._add(os.path.join(dirpath, name))

    def read(self) -> set[tuple[Change, str]]:
        """Every change reported since the last read (empty when none); raises
        :class:`Overflow` when the kernel's queue overflowed."""
        out: set[tuple[Change, str]] = set()
        data = drain(self.fd)
        at = 0
        while at < len(data):
            wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
            name = data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0")
            at += _EVENT.size + size
            self._note(out, wd, mask, name)
        return out

    def _note(self, out: set[Any], wd: int, mask: int, name: bytes) -> None:
        if mask & IN_Q_OVERFLOW:
            raise Overflow("inotify queue overflow: changes were lost")
        if mask & IN_IGNORED:
            self.dirs.pop(wd, None)
            return
        base = self.dirs.get(wd)
        if base is None:
            return
        path = os.path.join(base, os.fsdecode(name)) if name else base
        if mask & (IN_CREATE | IN_MOVED_TO):
            out.add((Change.added, path))
            if mask & IN_ISDIR:
                self._add_tree(path, strict=False)
        elif mask & (IN_DELETE | IN_MOVED_FROM):
            out.add((Change.deleted, path))
        elif mask & (IN_MODIFY | IN_ATTRIB):
            out.add((Change.modified, path))
        elif mask & (IN_DELETE_SELF | IN_MOVE_SELF) and not name:
            out.add((Change.deleted, path))

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


async def changes(
    folders: Iterable[Path], *, debounce: int, step: int, stop: asyncio.Event
) -> AsyncGenerator[set[tuple[Change, str]], None]:
    """Batches of changes under ``folders`` until ``stop`` is set, as ``watchfiles.awatch``
    gives them: a batch is yielded once ``step`` ms pass with no new change, or
    ``debounce`` ms after its first change. The watches exist once the generator's first
    step ran. Raises ``OSError`` (set-up) or :class:`Overflow`."""
    watch = Inotify(folders)
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    loop.add_reader(watch.fd, ready.set)
    try:
        while not stop.is_set():
            await first_of(ready.wait(), stop.wait())
            if stop.is_set():
                return
            ready.clear()
            batch = watch.read()
            start = loop.time()
            while loop.time() - start < debounce / 1000:
                await first_of(ready.wait(), stop.wait(), timeout=step / 1000)
                if not ready.is_set():
                    break  # a quiet step
                ready.clear()
                batch |= watch.read()
            if batch:
                yield batch
    finally:
        loop.remove_reader(watch.fd)
        watch.close()
