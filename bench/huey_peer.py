"""The peer of ``bench/throughput.py``: drain N no-op tasks through huey's SqliteHuey.

Run as ``python bench/huey_peer.py N DB_PATH default|normal noop|fail_once|exec [WORKERS]
[thread|process]``; prints one JSON line ``{"tasks": N, "seconds": s, "per_s": r}``.
Enqueueing is not timed; the clock runs from the consumer's start until the N-th task has
finished. WORKERS workers (default 2) of the given type (default threads), huey's own
storage defaults (WAL, synchronous FULL), or ``synchronous=NORMAL`` to match flowrun.
Case ``exec``: each task runs ``subprocess.run(["/bin/true"])``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time

from huey import SqliteHuey
from huey.storage import SqliteStorage


class NormalStorage(SqliteStorage):
    """huey's SQLite storage with ``synchronous=NORMAL`` (flowrun's setting)."""

    def _create_connection(self):
        conn = super()._create_connection()
        conn.execute("pragma synchronous=1")
        return conn


def main() -> None:
    n, path, sync, case = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    worker_type = sys.argv[6] if len(sys.argv) > 6 else "thread"
    kwargs = {"storage_class": NormalStorage} if sync == "normal" else {}
    huey = SqliteHuey("bench", filename=path, results=False, **kwargs)
    # worker processes (forked) count through shared memory; threads through a plain lock
    done = multiprocessing.Value("l", 0, lock=False)
    lock = multiprocessing.Lock() if worker_type == "process" else threading.Lock()
    failed_once: set[int] = set()

    @huey.task(retries=1 if case == "fail_once" else 0, retry_delay=0)
    def task(i: int) -> None:
        if case == "fail_once":
            with lock:
                first = i not in failed_once
                failed_once.add(i)
            if first:
                raise RuntimeError("fail once")
        elif case == "exec":
            subprocess.run(["/bin/true"], check=True)
        with lock:
            done.value += 1

    for i in range(n):
        task(i)
    logging.disable(logging.CRITICAL)
    consumer = huey.create_consumer(workers=workers, worker_type=worker_type, periodic=False)
    start = time.perf_counter()

    def watch() -> None:
        while done.value < n:
            time.sleep(0.002)
        secs = time.perf_counter() - start
        print(json.dumps({"tasks": n, "seconds": secs, "per_s": n / secs}), flush=True)
        for child in multiprocessing.active_children():  # worker processes: no orphans
            child.kill()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()
    consumer.run()


if __name__ == "__main__":
    main()
