"""One process's writers of a SQLite file, taking turns without SQLite's busy-wait.

SQLite lets one write transaction at a time into a file; a writer that finds the lock
taken sleeps in its busy handler by steps of 1, 2, 5, 10, 15... ms, however soon the lock
frees. Between two threads of one process that overshoot is avoidable: the worker's
database cycles (``engine.cycle_runner``) and the attempt logs' writer
(``store.log_writer``) hold the file's :func:`gate_for` lock around their writes, so the
one that waits is woken the moment the other is done, and a cycle on the event loop
that finds the gate taken goes to its database thread at once instead of failing on the
lock. Other processes, and this process's other writers, still meet at SQLite's lock
(busy handler). No database access here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine

from runner.store.db import file_sibling_ok

T = TypeVar("T")

_gates: dict[str, threading.Lock] = {}
_gates_lock = threading.Lock()


def gate_for(engine: Engine) -> threading.Lock | None:
    """The lock this process's gated writers of ``engine``'s SQLite file share (one per
    file, whatever the engine), or ``None`` where no sibling engine reaches the same
    database (``db.file_sibling_ok``: PostgreSQL, whose row locks need no turns, and an
    in-memory database)."""
    if not file_sibling_ok(engine):
        return None
    path = engine.url.database or ""
    with _gates_lock:
        gate = _gates.get(path)
        if gate is None:
            gate = _gates[path] = threading.Lock()
        return gate


def gated(gate: threading.Lock | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` while holding ``gate`` (waiting for it; ``None``: no gate)."""
    if gate is None:
        return fn(*args)
    with gate:
        return fn(*args)


def if_free(gate: threading.Lock | None, fn: Callable[..., T | None], *args: Any) -> T | None:
    """``fn(*args)`` while holding ``gate`` if it is free now (``None``: no gate), else
    ``None`` without waiting (for the event loop)."""
    if gate is None:
        return fn(*args)
    if not gate.acquire(blocking=False):
        return None
    try:
        return fn(*args)
    finally:
        gate.release()
