"""The ``files`` sensor: new files in a folder, each acted on exactly once.

A file matching ``glob`` (hidden files only when the glob starts with ``.``) counts when

* its size and mtime have not changed for ``settle`` seconds, or
* it was renamed into place: the watcher's batch that adds it also deletes a
  non-matching sibling (the usual ``write .name.tmp, rename to name`` drop), or
* it is found by a scan and was last written at least ``settle`` seconds ago.

Files already present at start-up are reconciled, and the folder is rescanned every
``rescan`` seconds and whenever the watcher restarts, so nothing dropped while no watcher
ran is missed. A file counts once per path and inode: the event key is
``"<relative path>:<inode>"``, so a restart or a second daemon sees the same key (stored
once) and touching or rewriting a handled file starts nothing. With ``modified: true`` the
key is ``"<relative path>:<inode>:<size>:<mtime_ns>"``: every settled change counts again.
A file deleted and dropped again under the same name counts again: it has a new inode,
or, when the file system hands the old inode back (ext4 does), the sensor saw the
deletion and keys the new file ``"<relative path>:<inode>:<mtime_ns at first sight>"``.
Only a deletion and re-creation with the same inode while no daemon ran goes unseen.
A symlink whose target (every link on the way resolved) lies outside the folder counts
only with ``follow_symlinks: true``: otherwise it is ignored, with one INFO line per path,
so a link dropped into the folder cannot feed the flow a file from elsewhere. A symlink to a
file inside the folder counts like the file.
Payload: ``{"path": absolute path, "name": file name, "size": bytes}``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from watchfiles import Change

from runner.literal import literal
from runner.sensors.base import FileChange, Sensor

log = logging.getLogger("flowrun.sensors")

#: Full rescans of the folder, in seconds (a safety net for overflowed watch queues).
RESCAN = 30.0


@dataclass
class _Candidate:
    size: int
    mtime_ns: int
    since: float  # time.monotonic() when size/mtime were last seen changing


class FilesSensor(Sensor):
    """Emit one event per new (settled) file; see the module docstring.

    ``spec.files`` gives ``path`` (relative to the flow file's folder), ``glob``,
    ``recursive`` and ``settle`` (seconds).
    """

    def __init__(self, *args: Any, rescan: float = RESCAN, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.spec.files
        self.folder = self.resolve(cfg.path)
        self.glob: str = cfg.glob
        self.recursive: bool = bool(cfg.recursive)
        self.settle: float = float(cfg.settle)
        self.modified: bool = bool(cfg.modified)
        self.follow: bool = bool(cfg.follow_symlinks)
        self._root = os.path.realpath(self.folder)
        self._outside: set[str] = set()  # symlinks out of the folder already logged
        self.rescan = rescan
        self._candidates: dict[str, _Candidate] = {}
        self._ready: set[str] = set()  # renamed into place: count at once
        self._stored: dict[str, str] = {}  # path -> key stored by this process
        self._gone: set[str] = set()  # handled paths seen deleted (a new file may reuse the inode)
        self._suffix: dict[str, str] = {}  # path -> key suffix of a file re-created there
        self._scan_due = True

    def folders(self) -> list[Path]:
        return [self.folder]

    def busy(self) -> bool:
        return bool(self._candidates or self._ready or self._scan_due)

    def request_scan(self) -> None:
        """Rescan the whole folder soon (e.g. after the watcher restarted)."""
        self._scan_due = True
        self.kick()

    def matches(self, path: str) -> bool:
        """True when absolute ``path`` is inside the folder and matches the glob."""
        rel = os.path.relpath(path, self.folder)
        if rel == "." or rel.startswith(".." + os.sep) or rel == "..":
            return False
        parts = rel.split(os.sep)
        if len(parts) > 1 and not self.recursive:
            return False
        name = parts[-1]
        if name.startswith(".") and not self.glob.startswith("."):
            return False
        return fnmatchcase(rel.replace(os.sep, "/") if "/" in self.glob else name, self.glob)

    def leads_out(self, path: str) -> bool:
        """True when absolute ``path`` (inside the folder) reaches a file outside it
        through a symlink and ``follow_symlinks`` is off; logs it once per path. A path that
        cannot be read counts as leading out (it is not a file to act on either)."""
        if self.follow:
            return False
        if os.sep not in os.path.relpath(path, self.folder):  # directly in the folder
            try:
                if not stat.S_ISLNK(os.lstat(path).st_mode):
                    return False
            except OSError:
                return True
        real = os.path.realpath(path)
        if real.startswith(self._root.rstrip(os.sep) + os.sep):
            return False
        if path not in self._outside:
            self._outside.add(path)
            log.info(
                "sensor %s: ignoring %r, a symlink out of its folder to %r "
                "(follow_symlinks: true counts it)",
                self.name,
                os.path.relpath(path, self.folder),
                real,
            )
        return True

    def on_changes(self, changes: Sequence[FileChange]) -> None:
        # A batch that deletes a non-matching sibling and adds a matching file is a
        # rename into place (watchfiles reports a rename as deleted + added).
        renamed_from = {
            os.path.dirname(p)
            for c, p in changes
            if c == Change.deleted and not self.matches(p) and not os.path.lexists(p)
        }
        for change, path in changes:
            if not self.matches(path):
                continue
            if change == Change.deleted:
                self._candidates.pop(path, None)
                self._ready.discard(path)
                self._forget(path)
            elif change == Change.added and os.path.dirname(path) in renamed_from:
                self._candidates.pop(path, None)
                self._ready.add(path)
            elif path not in self._candidates:
                self._candidates[path] = _Candidate(-1, -1, time.monotonic())
        self.kick()

    async def run(self, stop: asyncio.Event) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._root = os.path.realpath(self.folder)  # the folder may be a symlink itself
        next_scan = 0.0
        while not stop.is_set():
            if self._scan_due or time.monotonic() >= next_scan:
                self._scan_due = False
                next_scan = time.monotonic() + self.rescan
                rows = self._scan(await asyncio.to_thread(self._walk))
            else:
                rows = self._check()
            await self.store(rows)
            self._remember(rows)
            self.started.set()
            if self._ready:
                continue
            if self._candidates:
                timeout = max(min(self.settle / 4, 0.05), 0.005)
            else:
                timeout = next_scan - time.monotonic()
            await self._wait(stop, timeout)

    def _forget(self, path: str) -> None:
        """``path`` was deleted: a file created there later is a new file, even if the file
        system gives it the old inode."""
        if self._stored.pop(path, None) is not None:
            self._gone.add(path)
        self._suffix.pop(path, None)

    def _remember(self, rows: Sequence[tuple[str, dict[str, Any]]]) -> None:
        for key, payload in rows:
            self._stored[payload["path"]] = key

    def not_utf8(self, path: str) -> bool:
        """True when ``path``'s name is not UTF-8 (bytes kept as lone surrogates): no
        database stores it, so the file is not acted on; logs it once per path, with the
        undecodable bytes shown as ``\\xNN``."""
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            if path not in self._outside:
                self._outside.add(path)
                log.warning(
                    "sensor %s: ignoring %s: its name is not UTF-8 (rename it to act on it)",
                    self.name,
                    literal(os.path.relpath(path, self.folder)),
                )
            return True
        return False

    def _event(self, path: str, st: os.stat_result) -> tuple[str, dict[str, Any]] | None:
        if self.not_utf8(path) or self.leads_out(path):
            return None
        rel = os.path.relpath(path, self.folder).replace(os.sep, "/")
        if path in self._gone:  # re-created after a deletion this process saw
            self._gone.discard(path)
            self._suffix[path] = f":{st.st_mtime_ns}"
        key = f"{rel}:{st.st_ino}{self._suffix.get(path, '')}"
        if self.modified:
            key += f":{st.st_size}:{st.st_mtime_ns}"
        if self._stored.get(path) == key:
            return None
        name = os.path.basename(path)
        return key, {"path": path, "name": name, "size": st.st_size, "host": self.host}

    def _check(self) -> list[tuple[str, dict[str, Any]]]:
        """Settle candidates: those unchanged for ``settle`` seconds (or renamed in) count."""
        rows = []
        now = time.monotonic()
        ready, self._ready = self._ready, set()
        for path in ready:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (row := self._event(path, st)) is not None:
                rows.append(row)
        for path, cand in list(self._candidates.items()):
            try:
                st = os.stat(path)
            except OSError:
                del self._candidates[path]
                continue
            if (st.st_size, st.st_mtime_ns) != (cand.size, cand.mtime_ns):
                cand.size, cand.mtime_ns, cand.since = st.st_size, st.st_mtime_ns, now
                if self.settle > 0:
                    continue
            if now - cand.since >= self.settle:
                del self._candidates[path]
                if (row := self._event(path, st)) is not None:
                    rows.append(row)
        return rows

    def _scan(self, found: list[tuple[str, os.stat_result]]) -> list[tuple[str, dict[str, Any]]]:
        """Reconcile a folder walk: old enough files count, fresh ones settle."""
        rows = []
        wall, mono = time.time(), time.monotonic()
        for path in set(self._stored) - {p for p, _ in found}:
            self._forget(path)
        for path, st in found:
            if path in self._candidates or path in self._ready:
                continue
            age = wall - st.st_mtime_ns / 1e9
            if age >= self.settle:
                if (row := self._event(path, st)) is not None:
                    rows.append(row)
            else:
                self._candidates[path] = _Candidate(
                    st.st_size, st.st_mtime_ns, mono - max(age, 0.0)
                )
        return rows + self._check()

    def _walk(self) -> list[tuple[str, os.stat_result]]:
        """Every matching file with its stat (runs in a thread; touches no sensor state)."""
        if self.recursive:
            paths: list[str] = []
            for root, dirs, names in os.walk(self.folder):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                paths.extend(os.path.join(root, n) for n in names)
        else:
            try:
                with os.scandir(self.folder) as it:
                    paths = [e.path for e in it]
            except FileNotFoundError:
                return []
        found = []
        for path in paths:
            if self.matches(path) and not self.leads_out(path):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append((path, st))
        return found
