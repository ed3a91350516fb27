"""One test at a time may restart the shared PostgreSQL server (or fill its connection
slots); the others share it. With ``pytest -n N`` (pytest-xdist) the tests run in N
processes, so the rule is a readers-writer lock on files, fair to the writer:

- every test holds the *room* lock shared while it runs (:func:`shared`);
- a test marked ``server_alone`` (:func:`alone`) first takes the *turnstile* lock, then the
  room lock exclusively: once it waits at the room, no new test gets in (each passes the
  turnstile first), so it waits only for the tests already running, never for ever.

The files live in the system's temporary folder, named by user: two test sessions on one
machine (they share the server too) keep the same rule. ``fcntl.flock`` locks are released
by the kernel when their process dies: a killed worker holds nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _path(name: str, folder: Path | None) -> Path:
    return (folder or Path(tempfile.gettempdir())) / f"flowrun-tests-{os.getuid()}-{name}.lock"


@contextmanager
def _locked(name: str, mode: int, folder: Path | None) -> Iterator[None]:
    fd = os.open(_path(name, folder), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextmanager
def shared(folder: Path | None = None) -> Iterator[None]:
    """Hold the server shared for the block (waits while a ``server_alone`` test runs or
    waits). ``folder``: where the lock files are (default: the temporary folder)."""
    with _locked("turnstile", fcntl.LOCK_EX, folder):
        pass
    with _locked("room", fcntl.LOCK_SH, folder):
        yield


@contextmanager
def alone(folder: Path | None = None) -> Iterator[None]:
    """Hold the server alone for the block: no other test runs meanwhile."""
    with _locked("turnstile", fcntl.LOCK_EX, folder), _locked("room", fcntl.LOCK_EX, folder):
        yield
