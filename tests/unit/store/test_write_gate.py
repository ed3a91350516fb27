"""This process's SQLite writers taking turns (``store.write_gate``): the attempt logs'
writer stores its rows in short statements, each inside the file's gate, so a worker's
cycle waits for one statement, not a batch, and is woken when it ends. Real SQLite files."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from runner.log_buffer import STDOUT
from runner.store.db import make_engine
from runner.store.log_reader import chunks
from runner.store.log_writer import STATEMENT_BYTES, LogWriter
from runner.store.write_gate import gate_for
from tests.support.fault import flow_world, new_instance

FLOW = """\
initial: a
states:
  a: {exec: [/bin/true], next: done}
  done: {terminal: true}
"""


def test_one_gate_per_file_and_none_without_a_file(tmp_path: Path) -> None:
    a = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    b = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    c = make_engine(f"sqlite:///{tmp_path / 'y.db'}")
    assert gate_for(a) is gate_for(b) is not None
    assert gate_for(c) is not gate_for(a)
    assert gate_for(make_engine("sqlite://")) is None


def test_a_big_batch_is_stored_in_short_statements(tmp_path: Path) -> None:
    engine, flow = flow_world(tmp_path, "f", FLOW)
    iid = new_instance(engine, flow)
    writer = LogWriter(engine)
    log = writer.open(iid, 1)
    for _ in range(16):
        log.write(STDOUT, b"x" * (64 << 10))
    inserts = [(iid, 1, i, STDOUT, 0.0, 0, b"x" * (64 << 10)) for i in range(16)]
    statements = writer._sql.statements(inserts, [])
    assert len(statements) == 16 * (64 << 10) // STATEMENT_BYTES  # ~128 KiB each
    log.end()
    deadline = time.monotonic() + 20  # stored by the writer's thread, or by this flush
    while writer.flush() or time.monotonic() < deadline:
        if sum(len(c.data) for c in chunks(engine, iid, 1, 0, 100)) == 16 << 16:
            break
        time.sleep(0.05)
    assert sum(len(c.data) for c in chunks(engine, iid, 1, 0, 100)) == 16 << 16


def test_the_writer_waits_for_the_gate_and_stores_once_it_is_free(tmp_path: Path) -> None:
    engine, flow = flow_world(tmp_path, "f", FLOW)
    iid = new_instance(engine, flow)
    writer = LogWriter(engine)
    log = writer.open(iid, 1)
    log.write(STDOUT, b"after the cycle\n")
    gate = gate_for(engine)
    assert gate is not None
    gate.acquire()  # a worker's cycle is writing
    done = threading.Event()
    flushing = threading.Thread(target=lambda: (writer.flush(), done.set()))
    flushing.start()
    try:
        assert not done.wait(0.3)  # not beside the cycle
        assert list(chunks(engine, iid, 1, 0, 10)) == []
    finally:
        gate.release()
    assert done.wait(10)
    flushing.join()
    assert b"".join(c.data for c in chunks(engine, iid, 1, 0, 10)) == b"after the cycle\n"
