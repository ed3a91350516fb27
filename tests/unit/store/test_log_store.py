"""Attempt logs in the store (issue 29): the cap's head + tail + gap, bounded memory,
deleted with their instance, evicted past ``--log-store-max``. Real SQLite files."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import update

from runner.log_buffer import PENDING_MAX, STDOUT, AttemptLog
from runner.ops.prune import Pacing, prune, rules_for
from runner.store import prune as store_prune
from runner.store import prune_instances
from runner.store.db import make_engine
from runner.store.log_reader import Pieces, chunks
from runner.store.log_writer import STATEMENT_BYTES, LogWriter, flush_all, writer_for
from runner.store.tables import instances
from tests.support.fault import db_url, flow_world, new_instance, sql

FLOW = """\
initial: a
states:
  a: {exec: [/bin/true], next: done}
  done: {terminal: true}
"""


def _read(engine, iid: int, attempt: int = 1) -> tuple[bytes, list[int]]:
    walk, out, gaps = Pieces(), b"", []
    for c in chunks(engine, iid, attempt, 0, 100000):
        gap = walk.next(c)
        if gap:
            gaps.append(gap)
        out += c.data
    return out, gaps


def test_cap_keeps_the_head_and_the_last_part(tmp_path: Path) -> None:
    engine, flow = flow_world(tmp_path, "f", FLOW)
    iid = new_instance(engine, flow)
    writer = LogWriter(engine)
    log = writer.open(iid, 1, log_max=300_000)  # head 150,000, tail 150,000
    whole = b"".join(f"{i:09d}\n".encode() for i in range(100_000))  # 1,000,000 bytes
    for i in range(0, len(whole), 7000):
        log.write(1 + (i // 7000) % 2, whole[i : i + 7000])
        if i % 70000 == 0:
            writer.flush(64 << 10)  # a slow writer: a budget a batch
    log.end()
    while writer.flush():
        pass
    out, gaps = _read(engine, iid)
    assert out[:150_000] == whole[:150_000]
    assert whole.endswith(out[150_000:])
    assert 140_000 <= len(out) - 150_000 <= 150_000  # the tail: whole rows within the cap
    assert gaps == [len(whole) - len(out)]
    assert Pieces().ended is False
    walk = Pieces()
    for c in chunks(engine, iid, 1, 0, 100000):
        walk.next(c)
    assert walk.ended


def test_memory_stays_bounded_when_nothing_is_stored(tmp_path: Path) -> None:
    class Nowhere:
        def queue(self, item) -> None:
            pass

    log = AttemptLog(Nowhere(), 1, 1, 10 << 20)
    for _ in range(2000):  # 128 MB written, never taken
        log.write(1, b"x" * 65536)
    rows, keep_from, _left = log.take()
    held = sum(len(r[4]) for r in rows)
    assert held <= (1 << 20) + PENDING_MAX + 65536
    assert keep_from == log.cut > 1 << 20
    assert log.offset == 2000 * 65536


def test_logs_go_with_their_instance_and_past_the_store_bound(tmp_path: Path) -> None:
    engine, flow = flow_world(tmp_path, "f", FLOW)
    ids = [new_instance(engine, flow) for _ in range(4)]
    writer = LogWriter(engine)
    for n, iid in enumerate(ids):
        log = writer.open(iid, 1)
        log.write(1, b"y" * 100_000)
        log.end()
        with engine.begin() as conn:  # terminal, oldest first: ids[0]
            conn.execute(
                update(instances)
                .where(instances.c.id == iid)
                .values(status="completed", state="done", updated_at=1000.0 + n)
            )
    writer.flush()
    with engine.begin() as conn:  # ids[3] stays live
        conn.execute(update(instances).where(instances.c.id == ids[3]).values(status="runnable"))
    assert store_prune.log_bytes(engine) == 400_000
    fast = Pacing(rest=0.0, min_rest=0.0)
    rules = rules_for([flow], log_store_max=250_000)
    counts = prune(engine, rules, now=2000.0, pacing=fast)
    assert counts["logs"] == 2  # ids[0] and ids[1], the least recently changed
    left = {r[0] for r in sql(engine, "SELECT DISTINCT instance_id FROM attempt_logs")}
    assert left == {ids[2], ids[3]}
    # the instance itself goes with its logs
    gone = prune_instances.delete_instances(engine, [ids[2]], "completed", 10**12)
    assert gone["instances"] == 1  # ("logs" counts attempt rows: there are none here)
    left = {r[0] for r in sql(engine, "SELECT DISTINCT instance_id FROM attempt_logs")}
    assert left == {ids[3]}


def test_a_silent_attempt_costs_the_writer_nothing(tmp_path: Path) -> None:
    # its attempt row's log_bytes (0) tells a follower it ended: no end row, no batch
    engine, flow = flow_world(tmp_path, "f", FLOW)
    iid = new_instance(engine, flow)
    writer = LogWriter(engine)
    assert writer.open(iid, 1).end() == 0
    assert writer.flush() == 0 and writer._thread is None
    assert chunks(engine, iid, 1) == []


def test_an_attempt_that_wrote_stores_its_end_row_last(tmp_path: Path) -> None:
    # what tells a follower (`logs -f`) the attempt's output is complete: no waiting
    engine, flow = flow_world(tmp_path, "f", FLOW)
    iid = new_instance(engine, flow)
    writer = LogWriter(engine)
    log = writer.open(iid, 1)
    log.write(STDOUT, b"hi\n")
    assert log.end() == 3 and log.end() == 3
    assert writer.flush() == 2
    walk = Pieces()
    stored = chunks(engine, iid, 1)
    for c in stored:
        walk.next(c)
    assert walk.ended and [c.data for c in stored] == [b"hi\n", b""]
    assert stored[-1].offset == 3


def test_a_writer_given_up_is_not_waited_for_at_exit(tmp_path: Path, caplog) -> None:
    """A worker that stopped with its database unreachable gives its writer up: the flush
    at exit stores nothing for it (one line says so) rather than holding the stop past its
    grace; another database's writer is still flushed."""
    engine, flow = flow_world(tmp_path, "f", FLOW)
    other = make_engine(db_url(tmp_path))  # the same file, another writer
    iid, jid = new_instance(engine, flow), new_instance(engine, flow)
    given_up, kept = writer_for(engine), writer_for(other)
    assert given_up is not None and kept is not None and given_up is not kept
    given_up.every = kept.every = 3600.0  # the writers' own threads stay out of it
    given_up.open(iid, 1).write(1, b"never stored\n")
    kept.open(jid, 1).write(1, b"stored at exit\n")
    given_up.give_up()
    caplog.set_level("WARNING", logger="flowrun.logs")
    flush_all()
    assert _read(engine, iid)[0] == b""
    assert _read(engine, jid)[0] == b"stored at exit\n"
    said = [r.getMessage() for r in caplog.records]
    assert said == ["attempt logs not stored at exit: the database does not answer"]
    given_up.given_up = False  # still held: stored once the database answers
    while given_up.flush():
        pass
    assert _read(engine, iid)[0] == b"never stored\n"
    other.dispose()


def test_a_big_batch_is_stored_in_short_statements(tmp_path: Path) -> None:
    """On SQLite each statement of the writer is a transaction of its own of about
    ``STATEMENT_BYTES``: a worker's cycle meets the write lock for one at most."""
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
