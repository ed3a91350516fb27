"""Processes opening the same new SQLite file at the same moment all get it in WAL mode.

Switching a new file to WAL upgrades a read lock inside one statement, and SQLite answers
"database is locked" at once there (no busy handler), so without ``wal.enter_wal``'s
retry about a third of these races failed (4 processes, plain ``PRAGMA journal_mode=WAL``);
``make_engine`` hit it in ``test_concurrent_upgrades_all_succeed``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

RACER = """
import sqlite3, sys, time
from runner.store.wal import enter_wal
folder, start, races = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
for i in range(races):
    at = start + i * 0.05
    while time.time() < at:
        pass
    conn = sqlite3.connect(f"{folder}/{i}.db", timeout=30, isolation_level=None)
    enter_wal(conn.cursor(), 30)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    conn.execute("COMMIT")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal", mode
    conn.close()
print("ok")
"""


def test_processes_racing_to_open_a_new_file_all_enter_wal(tmp_path: Path) -> None:
    races = 20
    start = time.time() + 2.0  # every process has imported before the first race
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", RACER, str(tmp_path), str(start), str(races)]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.strip() == "ok"
