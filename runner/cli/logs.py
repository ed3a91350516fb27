"""``flowrun logs``: what an attempt's handler wrote, as stored, optionally followed live.

The chunks come from the database (``runner.store.log_reader``), whichever daemon ran the
attempt. Shown escaped (``runner.literal``: control characters and escape sequences
spelled out, so a log cannot rewrite the operator's terminal) unless ``--raw``, which
writes the bytes as the handler wrote them.
"""

from __future__ import annotations

import codecs
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from runner.cli.context import Ctx, pass_ctx
from runner.errors import UserError
from runner.literal import literal
from runner.log_buffer import END_GRACE

#: Seconds between two looks for the next attempt (``--follow-next``).
POLL = 0.1
#: Seconds between two looks for new output while following when nothing wakes the
#: follower sooner (it is woken by the log writer's commits: ``runner.store.log_bell``;
#: on PostgreSQL the end of an attempt that wrote nothing rings no bell: it is seen at
#: the next look).
FOLLOW_POLL = 0.25
TERMINAL = ("completed", "failed", "killed")


@click.command("logs")
@click.argument("instance_id", type=int)
@click.option(
    "--attempt", "attempt_no", type=int, help="This attempt (1-based; default: the latest)."
)
@click.option("--state", "state", help="The latest attempt in this state.")
@click.option("--stream", type=click.Choice(["stdout", "stderr"]), help="Only this stream.")
@click.option(
    "-f", "--follow", is_flag=True, help="Keep showing new output until the attempt ends."
)
@click.option(
    "--follow-next", is_flag=True, help="Follow, then the next attempts, until the instance ends."
)
@click.option("--tail", "tail", type=click.IntRange(min=0), help="Only the last N lines.")
@click.option("--timestamps", is_flag=True, help="Start each line with when it was read (UTC).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a chunk.")
@click.option("--raw", is_flag=True, help="The bytes as written (control characters unescaped).")
@pass_ctx
def logs_cmd(
    c: Ctx,
    instance_id: int,
    attempt_no: int | None,
    state: str | None,
    stream: str | None,
    follow: bool,
    follow_next: bool,
    tail: int | None,
    timestamps: bool,
    as_json: bool,
    raw: bool,
):
    """What an attempt of INSTANCE_ID wrote on stdout and stderr (default: the latest attempt).

    Kept per attempt: the first 1 MiB and the last part up to the state's log_max
    (default 10 MiB), with a marker where bytes were dropped; deleted with the instance.

    \f
    Raises:
        UserError: no such instance or attempt (exit 1), both --attempt and --state (exit 2).
    """
    from runner.store import log_reader

    if attempt_no is not None and state is not None:
        raise UserError("logs: give --attempt or --state, not both", 2)
    engine = c.engine
    found = log_reader.attempts_of(engine, instance_id)
    if found is None:
        raise UserError(f"no instance {instance_id}", 1)
    follow = follow or follow_next
    number = _pick(found, instance_id, attempt_no, state, wait=follow_next)
    if number is None:  # --follow-next on an instance with no attempt yet
        number = _wait_attempt(engine, instance_id, 1)
        if number is None:
            return
    out = _Out(stream, timestamps, as_json, raw)
    listen = None
    if follow and c.listen_db is not None:
        from runner.store.notify import listen_db_url

        listen = listen_db_url(c.listen_db)
    while True:
        _show(engine, instance_id, number, out, tail, follow, listen)
        if not follow_next:
            return
        number = _wait_attempt(engine, instance_id, number + 1)
        if number is None:
            return
        tail = None


def _pick(found, instance_id: int, attempt_no: int | None, state: str | None, wait: bool):
    """The attempt number to show; ``None`` when there is none yet and ``wait``."""
    if attempt_no is not None:
        if all(a.attempt != attempt_no for a in found):
            raise UserError(f"instance {instance_id} has no attempt {attempt_no}", 1)
        return attempt_no
    if state is not None:
        inside = [a for a in found if a.state == state]
        if not inside:
            raise UserError(f"instance {instance_id} has no attempt in state {literal(state)}", 1)
        return inside[-1].attempt
    if not found:
        if wait:
            return None
        raise UserError(f"instance {instance_id} has no attempt yet", 1)
    return found[-1].attempt


def _wait_attempt(engine, instance_id: int, number: int) -> int | None:
    """Wait for attempt ``number`` of the instance to start; ``None`` once the instance
    is terminal (or gone) without it."""
    from sqlalchemy import select

    from runner.store import log_reader
    from runner.store.db import reading
    from runner.store.tables import instances

    while True:
        found = log_reader.attempts_of(engine, instance_id) or []
        later = [a.attempt for a in found if a.attempt >= number]
        if later:
            return min(later)
        with reading(engine) as conn:
            status = conn.execute(
                select(instances.c.status).where(instances.c.id == instance_id)
            ).scalar()
        if status is None or status in TERMINAL:
            return None
        time.sleep(POLL)


def _show(
    engine,
    instance_id: int,
    number: int,
    out: _Out,
    tail: int | None,
    follow: bool,
    listen: str | None = None,
):
    """Print attempt ``number``'s stored output; with ``follow``, then what comes, until it
    has ended (woken by commits: ``LISTEN`` on ``listen``, ``--listen-db``, when given)."""
    from runner.store import log_reader
    from runner.store.log_bell import LogBell

    walk = log_reader.Pieces()
    bell = LogBell(engine, listen) if follow else None
    try:
        _walk(engine, instance_id, number, out, tail, walk, bell)
    finally:
        if bell is not None:
            bell.close()
    out.done()


def _walk(engine, instance_id, number, out: _Out, tail, walk, bell) -> None:
    """Print what is stored past what ``walk`` saw; with a ``bell`` (following), then
    what comes, until the end row (at once for an attempt that ended having written
    nothing; for a lost attempt, ``END_GRACE`` after it ended)."""
    from runner.store import log_reader

    after = 0
    if tail is not None:
        items = []
        while batch := log_reader.chunks(engine, instance_id, number, after):
            items.extend(batch)
            after = batch[-1].seq
        out.tail(items, walk, tail)
    ended_at = None
    while True:
        batch = log_reader.chunks(engine, instance_id, number, after)
        for chunk in batch:
            out.chunk(chunk, walk.next(chunk))
        if batch:
            after = batch[-1].seq
            if len(batch) >= 2000:
                continue
        if bell is None or walk.ended:
            break
        end = log_reader.outcome_of(engine, instance_id, number)
        if end.ended:
            if end.log_bytes == 0:
                break  # it wrote nothing: no end row comes
            # its last output and its end row are stored within a writer's batch of the
            # end: wait that long, no longer
            now = time.monotonic()
            ended_at = ended_at or now
            if end.finished_at is not None and time.time() - end.finished_at > END_GRACE:
                break
            if now - ended_at > END_GRACE:
                break  # the end row never came (a lost attempt)
        bell.wait(FOLLOW_POLL)


class _Out:
    """Writes chunks as the options ask: escaped text, raw bytes or JSON lines."""

    def __init__(self, stream: str | None, timestamps: bool, as_json: bool, raw: bool):
        self.want = {"stdout": 1, "stderr": 2}.get(stream or "", None)
        self.timestamps, self.as_json, self.raw = timestamps, as_json, raw
        self.decoders: dict[int, codecs.IncrementalDecoder] = {}
        self.line_start = True
        self.stdout = sys.stdout

    def chunk(self, chunk, dropped: int) -> None:
        from runner.store.log_reader import STREAMS, marker

        if dropped:
            self._marker(marker(dropped), dropped)
        if chunk.stream not in STREAMS or (self.want and chunk.stream != self.want):
            return
        if self.raw and not self.timestamps and not self.as_json:
            self.stdout.flush()
            self.stdout.buffer.write(chunk.data)
            self.stdout.buffer.flush()
            return
        text = self._decode(chunk.stream, chunk.data)
        if self.as_json:
            obj = {"seq": chunk.seq, "stream": STREAMS[chunk.stream], "at": _iso(chunk.at)}
            obj["text"] = text
            self.stdout.write(json.dumps(obj) + "\n")
        else:
            shown = text if self.raw else literal(text, lines=True)
            if self.timestamps:
                shown = self._stamped(shown, chunk.at)
            elif shown:
                self.line_start = shown.endswith("\n")
            self.stdout.write(shown)
        self.stdout.flush()

    def tail(self, items, walk, lines: int) -> None:
        """Show the last ``lines`` lines of ``items`` (all the attempt's chunks)."""
        kept: list[Any] = []
        count = 0
        for chunk in reversed(items):
            if chunk.stream in (1, 2) and (not self.want or chunk.stream == self.want):
                count += chunk.data.count(b"\n")
            kept.append(chunk)
            if count > lines:
                break
        kept.reverse()
        first = kept[0] if kept else None
        for chunk in items:
            if chunk is first:
                break
            walk.next(chunk)
        if first is None:
            return
        skip = max(0, count - lines)
        for i, chunk in enumerate(kept):
            dropped = walk.next(chunk)
            if i == 0 and skip and chunk.stream in (1, 2):
                cut = 0
                for _ in range(skip):
                    cut = chunk.data.index(b"\n", cut) + 1
                chunk = type(chunk)(
                    chunk.seq, chunk.stream, chunk.at, chunk.offset, chunk.data[cut:]
                )
            self.chunk(chunk, dropped if i else 0)

    def _marker(self, text: str, dropped: int) -> None:
        if self.as_json:
            self.stdout.write(json.dumps({"dropped": dropped}) + "\n")
        elif self.raw:
            sys.stderr.write(text + "\n")
        else:
            self.stdout.write(("" if self.line_start else "\n") + text + "\n")
            self.line_start = True

    def _decode(self, stream: int, data: bytes) -> str:
        dec = self.decoders.get(stream)
        if dec is None:
            dec = self.decoders[stream] = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        return dec.decode(data)

    def _stamped(self, text: str, at: float) -> str:
        stamp = _iso(at) + " "
        out = []
        for line in text.splitlines(keepends=True):
            out.append((stamp if self.line_start else "") + line)
            self.line_start = line.endswith("\n")
        return "".join(out)

    def done(self) -> None:
        """The attempt's output is over: end a last line left open."""
        if not self.raw and not self.as_json and not self.line_start:
            self.stdout.write("\n")
        self.stdout.flush()
        self.line_start = True


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


COMMANDS = (logs_cmd,)
