"""The ``tail`` sensor: follow a log file by a byte offset stored in the database.

Only whole lines count (a line without its ``\\n`` waits). A new sensor (no cursor yet)
starts at the end of an existing file with ``from: end`` (the default, like ``tail -f``)
or at its start with ``from: start``; a file that appears later, and every rotated
successor, is read from its start. Each line matching ``match``
(``re.search``; every line when there is no ``match``) is one event whose payload is the
named groups plus ``line`` (without the newline), ``file`` (the configured path) and
``host`` (the reading daemon's ``host`` label).

The cursor (``sensors.cursor``) is ``{"dev", "ino", "gen", "offset", "last"}``: the file's
identity, a generation bumped at every rotation or truncation, the offset just after the
last consumed line, and the hex of up to 64 bytes before that offset (a fingerprint). Events
and the cursor are written in ONE transaction. The event key is ``"dev:ino:gen:offset"`` of
the line's first byte, so a restart or a second daemon never stores a line twice.

Rotation:

* rename + new file: the old file is finished first through its open descriptor (or, after
  a restart, found again by its inode among its siblings), then the new file is read from 0;
* copytruncate: detected by a size below the offset or a changed fingerprint; the unread
  rest is taken from the copy (a sibling whose bytes before the offset match the
  fingerprint), then the truncated file is read from 0. Lines written between the copy and
  the truncation exist in neither file and cannot be recovered by anyone.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.sensors.base import Sensor, log
from runner.sensors.events import load_cursor

#: Seconds between two looks at the file while nothing wakes the sensor. The hub's
#: watcher (inotify, or watchfiles' polling where inotify cannot serve) wakes it at each
#: change of the file's folder, a watcher's restart too; this look is the safety net for
#: changes no watcher reports (a network file system written from another host). At 1 s
#: it was a ninth of an idle daemon's CPU (``docs/performance.md``, "Idle looks skipped").
POLL = 5.0
CHUNK = 1 << 20
FINGERPRINT = 64
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


class TailSensor(Sensor):
    """Follow ``spec.tail.path`` (relative to the flow file's folder); see the module doc."""

    def __init__(self, *args: Any, poll: float = POLL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.path = self.resolve(self.spec.tail.path)
        self.regex = re.compile(self.spec.tail.match) if self.spec.tail.match else None
        self.poll = poll
        self._fd: int | None = None
        self._dev = self._ino = 0
        self._gen = 0
        self._offset = 0
        self._last = b""

    def folders(self) -> list[Path]:
        return [self.path.parent]

    async def run(self, stop: asyncio.Event) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            cursor = await asyncio.to_thread(self._load)
            await self._resume(cursor)
            await self._follow()
            self.started.set()
            while not stop.is_set():
                await self._wait(stop, self.poll)
                await self._follow()
        finally:
            self._close()

    # -- state ------------------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        return load_cursor(self.engine, self.name)

    def _cursor(self) -> dict[str, Any]:
        return {
            "dev": self._dev,
            "ino": self._ino,
            "gen": self._gen,
            "offset": self._offset,
            "last": self._last.hex(),
        }

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self, path: Path | str) -> bool:
        """Open ``path`` as the followed file at offset 0 with a new generation."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        self._adopt(fd)
        return True

    def _adopt(self, fd: int) -> None:
        """Follow the open ``fd`` from offset 0 with a new generation."""
        self._close()
        st = os.fstat(fd)
        self._fd, self._dev, self._ino = fd, st.st_dev, st.st_ino
        self._gen += 1
        self._offset, self._last = 0, b""

    async def _resume(self, cursor: dict[str, Any]) -> None:
        """Continue where the cursor left off, finishing a file rotated while we were down."""
        if not cursor:  # a new sensor: ``from: end`` skips what the file already holds
            if self._open(self.path) and self.spec.tail.from_ == "end":
                await asyncio.to_thread(self._skip_to_end)
            await self.store([], self._cursor())
            return
        self._dev, self._ino = cursor.get("dev", 0), cursor.get("ino", 0)
        self._gen, self._offset = cursor.get("gen", 0), cursor.get("offset", 0)
        self._last = bytes.fromhex(cursor.get("last", ""))
        old = self._find(lambda p, st: (st.st_dev, st.st_ino) == (self._dev, self._ino))
        if old is not None:
            self._fd = os.open(old, os.O_RDONLY)
        elif self._open(self.path):
            await self.store([], self._cursor())

    def _skip_to_end(self) -> None:
        """Move the offset past the last whole line of the followed file (a partial last
        line is read once its newline comes), with its fingerprint."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        window = FINGERPRINT
        while True:
            start = max(size - window, 0)
            data = os.pread(self._fd, size - start, start)
            end = data.rfind(b"\n")
            if end >= 0 or start == 0:
                break
            window *= 4
        self._offset = start + end + 1
        self._last = os.pread(
            self._fd, min(self._offset, FINGERPRINT), self._offset - min(self._offset, FINGERPRINT)
        )

    def _find(self, accept: Callable[[Path, os.stat_result], bool]) -> str | None:
        """The followed path, else the most recently modified sibling (``app.log.1``, ...),
        for which ``accept(path, stat)`` holds."""
        found = self._find_all(accept)
        if self.path in found:
            return str(self.path)
        return str(found[-1]) if found else None

    def _find_all(self, accept: Callable[[Path, os.stat_result], bool]) -> list[Path]:
        """The path and its siblings for which ``accept(path, stat)`` holds, oldest first."""
        try:
            names = [
                Path(e.path)
                for e in os.scandir(self.path.parent)
                if e.name.startswith(self.path.name)
            ]
        except OSError:
            return []
        found = []
        for p in names:
            try:
                st = os.stat(p)
            except OSError:
                continue
            if accept(p, st):
                found.append((st.st_mtime_ns, str(p)))
        return [Path(p) for _, p in sorted(found)]

    # -- reading ----------------------------------------------------------------------

    def _truncated(self, fd: int) -> bool:
        """True when ``fd`` no longer holds what we consumed: smaller than the offset, or
        the bytes before the offset differ from the fingerprint (copytruncate)."""
        if os.fstat(fd).st_size < self._offset:
            return True
        if not self._last:
            return False
        n = len(self._last)
        return os.pread(fd, n, self._offset - n) != self._last

    async def _follow(self) -> None:
        """Read everything new; handle truncation and rotation; store events + cursor."""
        if self._fd is None:
            if not self._open(self.path):
                return
            await self.store([], self._cursor())
        while not await self._drain(self._fd):
            await self._from_copy()
            self._gen += 1
            self._offset, self._last = 0, b""
            log.info("sensor %s: %s was truncated; reading it from the start", self.name, self.path)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # rotated away, the new file is not there yet: keep the old descriptor
        if (st.st_dev, st.st_ino) != (self._dev, self._ino):
            await self._drain(self._fd)  # the old file's last lines, by its descriptor
            log.info("sensor %s: %s was rotated; following the new file", self.name, self.path)
            try:  # open the new file first: a rotation racing us is then seen next time
                new = os.open(self.path, os.O_RDONLY)
            except OSError:
                return
            now = os.fstat(new)
            if self._fd is not None:
                await self._read_between(os.fstat(self._fd), {(now.st_dev, now.st_ino)})
            self._adopt(new)
            await self.store([], self._cursor())
            await self._drain(self._fd)

    async def _read_between(self, old: os.stat_result, skip: set[tuple[int, int]]) -> None:
        """Read whole any rotated generation written after ``old`` (several rotations
        between two looks), oldest first, before the current file."""
        skip = skip | {(old.st_dev, old.st_ino)}

        def newer(p: Path, st: os.stat_result) -> bool:
            return (
                p != self.path
                and (st.st_dev, st.st_ino) not in skip
                and st.st_mtime_ns >= old.st_mtime_ns
                and not p.name.endswith(COMPRESSED)
            )

        for p in await asyncio.to_thread(self._find_all, newer):
            if self._open(p):
                log.info("sensor %s: reading rotated generation %s", self.name, p)
                await self.store([], self._cursor())
                await self._drain(self._fd)

    async def _from_copy(self) -> None:
        """After a copytruncate, read the unread rest of the old content from its copy."""
        if not self._offset:
            return

        def is_copy(p: Path, st: os.stat_result) -> bool:
            if p == self.path or st.st_size < self._offset:
                return False
            with open(p, "rb") as f:
                n = len(self._last)
                f.seek(self._offset - n)
                return f.read(n) == self._last

        copy = await asyncio.to_thread(self._find, is_copy)
        if copy is None:
            log.warning(
                "sensor %s: %s was truncated and its copy not found; lines written "
                "since offset %d are lost",
                self.name,
                self.path,
                self._offset,
            )
            return
        fd = os.open(copy, os.O_RDONLY)
        try:
            await self._drain(fd)
            first = os.fstat(fd)
        finally:
            os.close(fd)
        # several truncations between two looks: later copies, oldest first
        followed = (self._dev, self._ino)
        await self._read_between(first, {followed})
        if (self._dev, self._ino) != followed:
            self._open(self.path)  # back to the truncated file, read from 0 by the caller

    async def _drain(self, fd: int | None) -> bool:
        """Consume whole lines of ``fd`` from the offset to its end, chunk by chunk.

        Returns False when it stopped because ``fd`` was truncated under it."""
        while fd is not None:
            rows, used, last = await asyncio.to_thread(self._read, fd)
            if used is None:
                return False
            if not used:
                return True
            self._offset += used
            self._last = last
            await self.store(rows, self._cursor())
        return True

    def _read(self, fd: int) -> tuple[list[tuple[str, dict[str, Any]]], int | None, bytes]:
        """Parse whole lines from the offset: (events, bytes consumed, new fingerprint);
        bytes consumed is ``None`` when ``fd`` was truncated (checked before and after the
        read, so a truncation racing the read is never taken for new lines)."""
        size = CHUNK
        while True:
            if self._truncated(fd):
                return [], None, self._last
            data = os.pread(fd, size, self._offset)
            if self._truncated(fd):
                return [], None, self._last
            end = data.rfind(b"\n") + 1
            if end or len(data) < size:
                break
            size *= 2  # one line longer than the chunk
        if not end:
            return [], 0, self._last
        rows = []
        start = 0
        while start < end:
            stop = data.index(b"\n", start) + 1
            text = data[start : stop - 1].decode("utf-8", "replace").rstrip("\r")
            m = self.regex.search(text) if self.regex else None
            if m is not None or self.regex is None:
                payload = dict(m.groupdict()) if m else {}
                payload.update(line=text, file=str(self.path), host=self.host)
                key = f"{self._dev}:{self._ino}:{self._gen}:{self._offset + start}"
                rows.append((key, payload))
            start = stop
        last = (self._last + data[:end])[-FINGERPRINT:]
        return rows, end, last
