"""``runner.store.wal.WalCheckpointer``: the worker's commits leave WAL checkpoints to a thread
of their own; the WAL must still be copied back and restarted (a real SQLite file)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from runner.store.wal import WalCheckpointer

ROUNDS, ROWS, BLOB = 12, 40, 2000  # ~80 KB a round, ~1 MB in all


def _writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")  # as the worker's loop connections, nearly
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v BLOB)")
    return conn


def _write_rounds(conn: sqlite3.Connection, between) -> int:
    """Write ROUNDS transactions, calling ``between()`` after each; returns the largest
    size the WAL file reached (it never shrinks: a restart overwrites it from the top)."""
    for _ in range(ROUNDS):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO t (v) VALUES (?)", [(os.urandom(BLOB),)] * ROWS)
        conn.execute("COMMIT")
        between()
    return os.path.getsize(conn.execute("PRAGMA database_list").fetchone()[2] + "-wal")


def test_checkpoints_keep_the_wal_from_growing(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    conn = _writer(path)
    ckpt = WalCheckpointer(str(path), every=0.01).start()

    def two_ticks() -> None:  # a whole look began after the last commit: it checkpointed
        seen = ckpt.looks  # it, or found that the last checkpoint had
        deadline = time.monotonic() + 30
        while ckpt.looks < seen + 2 and time.monotonic() < deadline:
            time.sleep(0.005)

    try:
        largest = _write_rounds(conn, two_ticks)
    finally:
        ckpt.stop()
    assert ckpt.checkpoints >= ROUNDS
    assert largest < 3 * ROWS * BLOB, f"the WAL grew to {largest} bytes"
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (ROUNDS * ROWS,)
    conn.close()


def test_without_a_checkpointer_the_wal_grows(tmp_path: Path) -> None:
    """The control: the same writes with no checkpoints pile up in the WAL."""
    conn = _writer(tmp_path / "n.db")
    largest = _write_rounds(conn, lambda: None)
    assert largest > 0.9 * ROUNDS * ROWS * BLOB
    conn.close()


def test_stop_is_idempotent_and_a_missing_folder_is_not_fatal(tmp_path: Path) -> None:
    ckpt = WalCheckpointer(str(tmp_path / "no" / "such" / "dir" / "x.db"), every=0.01).start()
    time.sleep(0.05)
    ckpt.stop()
    ckpt.stop()
    assert ckpt.checkpoints == 0
