"""Attempt logs, read: which attempt, its chunks in order, whether it is still running.

The rows are those ``runner.store.log_writer`` stores (``attempt_logs``), from any daemon
of the database: on a PostgreSQL fleet an attempt that ran on one host is read the same
way from any other. A gap between two consecutive chunks (the second starts past the
end of the first) is what the attempt's cap dropped: :func:`pieces` gives it as a
marker.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, func, select

from runner.log_buffer import END
from runner.store.db import reading
from runner.store.tables import attempt_logs, attempts, instances

STREAMS = {1: "stdout", 2: "stderr"}
#: Seconds a follower (``flowrun logs -f``, the console's log screen) still waits for an
#: ended attempt's last output when no end row says it is all there (a lost attempt).
END_GRACE = 1.5


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of an instance: ``attempt`` (1-based), ``state``, ``outcome`` (``None``
    while it runs), ``started_at``/``finished_at`` (epoch seconds UTC or ``None``),
    ``log_bytes`` (what it wrote to its log; 0: nothing and no end row comes; ``None``:
    not known, running or lost)."""

    attempt: int
    state: str
    outcome: str | None
    started_at: float | None
    finished_at: float | None
    log_bytes: int | None = None


def attempts_of(engine: Engine, instance_id: int) -> list[AttemptInfo] | None:
    """Every attempt of ``instance_id`` still stored, oldest first, the running one last
    (outcome ``None``); ``None`` when there is no such instance."""
    with reading(engine) as conn:
        inst = conn.execute(
            select(
                instances.c.state, instances.c.running_attempt, instances.c.state_attempted
            ).where(instances.c.id == instance_id)
        ).first()
        if inst is None:
            return None
        rows = conn.execute(
            select(
                attempts.c.attempt,
                attempts.c.state,
                attempts.c.outcome,
                attempts.c.started_at,
                attempts.c.finished_at,
                attempts.c.log_bytes,
            )
            .where(attempts.c.instance_id == instance_id)
            .order_by(attempts.c.attempt)
        ).all()
    out = [AttemptInfo(*r) for r in rows]
    running = inst.running_attempt
    if running is not None and all(a.attempt != running for a in out):
        out.append(AttemptInfo(running, inst.state, None, inst.state_attempted, None))
    return out


@dataclass(frozen=True)
class Ended:
    """Whether one attempt has ended, as its rows say now: ``ended`` once its row has an
    outcome, or the instance runs another attempt or none (an attempt whose row was
    never written: ``finished_at`` is then ``None``, else epoch seconds UTC);
    ``log_bytes`` what its handler wrote to its log (0: nothing, and no end row comes;
    ``None``: not known, as for a lost attempt)."""

    ended: bool
    finished_at: float | None = None
    log_bytes: int | None = None


def outcome_of(engine: Engine, instance_id: int, attempt: int) -> Ended:
    """Whether attempt ``attempt`` of ``instance_id`` has ended now (:class:`Ended`)."""
    with reading(engine) as conn:
        row = conn.execute(
            select(attempts.c.outcome, attempts.c.finished_at, attempts.c.log_bytes).where(
                attempts.c.instance_id == instance_id, attempts.c.attempt == attempt
            )
        ).first()
        if row is not None and row.outcome is not None:
            return Ended(True, row.finished_at, row.log_bytes)
        running = conn.execute(
            select(instances.c.running_attempt).where(instances.c.id == instance_id)
        ).scalar()
    return Ended(running != attempt)


@dataclass(frozen=True)
class Chunk:
    """One stored piece: ``seq``, ``stream`` (1 stdout, 2 stderr, 0 the end row), ``at``
    (epoch seconds UTC), ``offset`` (its first byte's position), ``data``."""

    seq: int
    stream: int
    at: float
    offset: int
    data: bytes


def chunks(
    engine: Engine, instance_id: int, attempt: int, after_seq: int = 0, limit: int = 2000
) -> list[Chunk]:
    """The next ``limit`` stored chunks of one attempt with ``seq > after_seq``, in order."""
    c = attempt_logs.c
    stmt = (
        select(c.seq, c.stream, c.at, c.offset, c.data)
        .where(c.instance_id == instance_id, c.attempt == attempt, c.seq > after_seq)
        .order_by(c.seq)
        .limit(limit)
    )
    with reading(engine) as conn:
        return [Chunk(r[0], r[1], r[2], r[3], bytes(r[4])) for r in conn.execute(stmt)]


def tail_start(engine: Engine, instance_id: int, attempt: int, keep: int) -> int:
    """The ``after_seq`` from which the last chunks hold at least ``keep`` bytes (0: all)."""
    c = attempt_logs.c
    stmt = (
        select(c.seq, func.length(c.data))
        .where(c.instance_id == instance_id, c.attempt == attempt)
        .order_by(c.seq.desc())
    )
    total = 0
    with reading(engine) as conn:
        for seq, size in conn.execute(stmt):
            total += size or 0
            if total >= keep:
                return seq - 1
    return 0


def stored_bytes(engine: Engine) -> int:
    """Bytes of every stored log chunk (the ``--log-store-max`` measure)."""
    with reading(engine) as conn:
        return conn.execute(
            select(func.coalesce(func.sum(func.length(attempt_logs.c.data)), 0))
        ).scalar_one()


@dataclass
class Pieces:
    """Walks chunks in order, telling the gaps: feed :meth:`next` each chunk."""

    expected: int | None = None
    ended: bool = False

    def next(self, chunk: Chunk) -> int:
        """Bytes dropped just before ``chunk`` (0: none); marks the end row."""
        gap = 0
        if self.expected is not None and chunk.offset > self.expected:
            gap = chunk.offset - self.expected
        self.expected = chunk.offset + len(chunk.data)
        if chunk.stream == END:
            self.ended = True
        return gap


def marker(dropped: int) -> str:
    """The line shown where the cap dropped ``dropped`` bytes."""
    return f"[flowrun: {dropped} bytes dropped here (log_max: the head and the last part are kept)]"
