"""Linux inotify's system calls through ``ctypes``: a descriptor and its watches.

Read by the event loop (``add_reader``) where something must be noticed at once without a
thread or a poll: the commits to a SQLite file (its ``-wal`` is written by every commit:
``runner.store.data_version.CommitBell``) and the sensor hub's file watcher
(``runner.sensors.inotify``). Elsewhere than Linux :func:`available` is False.
"""

from __future__ import annotations

import ctypes
import os

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018 - raises AttributeError where there is none
        libc.inotify_add_watch  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def available() -> bool:
    """True where inotify exists (Linux)."""
    return _LIBC is not None


def _error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def open_fd() -> int:
    """A new non-blocking, close-on-exec inotify descriptor (the caller closes it).
    Raises ``OSError`` (e.g. the per-user instance limit) or ``RuntimeError`` where
    there is no inotify."""
    if _LIBC is None:
        raise RuntimeError("no inotify here")
    fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise _error("inotify_init1")
    return fd


def add_watch(fd: int, path: str, mask: int) -> int:
    """Watch ``path`` for the events of ``mask`` on ``fd``; returns the watch descriptor.
    Raises ``OSError`` (``FileNotFoundError`` for a missing path; the per-user watch
    limit, ``fs.inotify.max_user_watches``)."""
    assert _LIBC is not None
    wd = _LIBC.inotify_add_watch(fd, os.fsencode(path), mask)
    if wd < 0:
        raise _error(f"inotify_add_watch {path!r}")
    return wd


def drain(fd: int) -> bytes:
    """Everything queued on ``fd`` (``b""`` when nothing is)."""
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return b"".join(chunks)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
