"""One running ``exec`` handler's pipes and exit, watched from the event loop
(``Supervised``): its output read as data comes, within the loop's budget for reading
(``runner.handlers.read_pace``), kept as a tail and given to its attempt log; its control
lines handled as read; its exit from ``runner.handlers.exits``. Used by
``runner.handlers.exec_handler``, which spawns the handler and ends its group.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from typing import Any, cast

from runner import control_channel
from runner.handlers import exits, reaper
from runner.handlers.attempt import TAIL, Cancel, CheckpointFn, Watch
from runner.handlers.data import remove_data_file
from runner.handlers.read_pace import pace_of
from runner.handlers.redact import Redactor
from runner.handlers.spawn import Child
from runner.log_buffer import STDERR, STDOUT, AttemptLog

#: Seconds after its start from which a handler's pipes are read as data comes.
READ_AFTER = 0.05


class Supervised:
    """One running handler, watched from the event loop with no transport or task.

    Its stdout, stderr and control pipe are blocking descriptors read by loop callbacks
    when they are ready, as data comes (only the last ``TAIL`` bytes of the output are kept
    here, so a handler may write gigabytes; the attempt's ``log``, if any, gets all of it
    and bounds its own memory: ``runner.store.log_writer``); its exit comes from
    ``runner.handlers.exits`` (or polling, without pidfds). Control lines are handled as they are
    read; checkpoints are stored in order by one task, started by the first one.
    """

    def __init__(
        self,
        child: Child,
        data: dict[str, Any],
        watch: Watch,
        cancel: Cancel,
        checkpoint: CheckpointFn,
        secrets: tuple[bytes, ...] = (),
        log: AttemptLog | None = None,
    ) -> None:
        self.child = child
        self.log = log
        self._stream = {child.out: STDOUT, child.err: STDERR}
        self.data = data
        self.watch = watch
        self.cancel = cancel
        self.checkpoint = checkpoint
        self.loop = asyncio.get_running_loop()
        self.goto: str | None = None
        self.sleep: float | None = None  # a ``sleep`` line's value (runner.control_channel.parse)
        self.bad: str | None = None
        self.last_checkpoint: dict[str, Any] | None = None
        # (data after the line, its values)
        self._pending: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._storing: asyncio.Task[None] | None = None
        self._bufs = {child.out: bytearray(), child.err: bytearray(), child.control: bytearray()}
        self._open = set(self._bufs)
        #: with secrets: each pipe's redactor (made at its first chunk), which what is read
        #: goes through before it is kept
        self._secrets = secrets
        self._redactors: dict[int, Redactor] = {}
        self._reading = False
        self.exited: asyncio.Future[int] = self.loop.create_future()  # the exit code
        code = child.exit_code
        if code is not None:  # it exited before we got here
            self.exited.set_result(code)
        elif child.exit_watched:
            child.on_exit = self._exited
        else:
            self.loop.call_soon(self._poll_exit)
        # Without a log most handlers are done before the pipes matter: they are watched
        # only from READ_AFTER seconds on (a pipe holds 64 kB; a handler writing more
        # meanwhile waits that long), and drained at the exit. With a log, stdout and
        # stderr are read from the start, as data comes, so the order of the two streams
        # is kept (read at the exit, what was left in both could not be ordered).
        self._live: set[int] = set()
        self._raw: set[int] = set()  # stdout, stderr watched through the exit set
        self._pace = pace_of(self.loop)  # the loop's budget for reading output
        self._held = False  # stdout and stderr not watched until the next window
        if log is not None:
            self._watch_live()
        self._timer = self.loop.call_later(READ_AFTER, self._start_reading)

    def _watch_live(self) -> None:
        for fd in (self.child.out, self.child.err):
            self._live.add(fd)
            self._watch(fd)

    def _watch(self, fd: int) -> None:
        """Read stdout or stderr (``fd``) as data comes: through the loop's exit set
        (``exits.watch_pipe``), else the loop's own reader."""
        if exits.watch_pipe(self.loop, fd, self._ready):
            self._raw.add(fd)
        else:
            self._raw.discard(fd)
            self.loop.add_reader(fd, self._paced, fd)

    def _unwatch(self, fd: int) -> None:
        """Stop reading ``fd`` (nothing when it was not watched)."""
        if fd in self._raw:
            exits.unwatch_pipe(self.loop, fd)
        else:
            self.loop.remove_reader(fd)

    def _start_reading(self) -> None:
        if not self._reading:
            self._reading = True
            for fd in self._open - self._live:
                if fd == self.child.control:  # unpaced: its lines are few and short
                    self.loop.add_reader(fd, self._readable, fd)
                else:
                    self._watch(fd)

    # -- exit ------------------------------------------------------------------------

    def _exited(self, code: int) -> None:
        """The handler exited with ``code`` (its status collected): on the loop."""
        self._timer.cancel()
        if not self.exited.done():
            self.exited.set_result(code)

    def _poll_exit(self) -> None:
        """Without pidfds: look every 20 ms."""
        code = self.child.proc.poll()
        if code is None:
            self.loop.call_later(0.02, self._poll_exit)
        else:
            reaper.leader_reaped(self.child.proc.pid)
            self._exited(code)

    # -- pipes -----------------------------------------------------------------------

    def _ready(self, fd: int, events: int) -> None:
        """``fd`` (a live pipe) is readable, or its writers are gone: no read needed."""
        if events & select.EPOLLIN:
            self._paced(fd)
        else:
            self._close_fd(fd)

    def _paced(self, fd: int) -> None:
        """Read one chunk from ``fd`` (stdout or stderr) within the loop's budget for
        reading output (``runner.handlers.read_pace``); past it, read nothing and hold
        this handler's output pipes until the next window (what is written meanwhile
        waits in the pipe)."""
        pace = self._pace
        if pace.over():
            self._hold()
            return
        began = time.perf_counter()
        self._readable(fd)
        pace.spent(time.perf_counter() - began)

    def _outputs(self) -> list[int]:
        """stdout and stderr, where open and watched."""
        child = self.child
        return [
            fd
            for fd in (child.out, child.err)
            if fd in self._open and (fd in self._live or self._reading)
        ]

    def _hold(self) -> None:
        if self._held:
            return
        self._held = True
        for fd in self._outputs():
            self._unwatch(fd)
        self._pace.later(self._unhold)

    def _unhold(self) -> None:
        self._held = False
        for fd in self._outputs():  # a closed one left _open (its number may be reused)
            self._watch(fd)

    def _readable(self, fd: int) -> bool:
        """Read one chunk from ``fd`` (known to be readable: the read ends are blocking);
        False at the end (EOF: ``fd`` is closed then)."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._close_fd(fd)
            return False
        self._keep(fd, chunk)
        return True

    def _keep(self, fd: int, chunk: bytes) -> None:
        """Add ``chunk`` read from ``fd`` to its buffer (secrets redacted first)."""
        if self._secrets:
            redactor = self._redactors.get(fd)
            if redactor is None:
                redactor = self._redactors[fd] = Redactor(self._secrets)
            chunk = redactor.feed(chunk)
        self._append(fd, chunk)

    def _append(self, fd: int, chunk: bytes) -> None:
        """Add ``chunk`` (redacted) to ``fd``'s buffer: control lines handled, a tail kept."""
        buf = self._bufs[fd]
        buf += chunk
        if fd == self.child.control:
            self._control(buf)
            return
        if self.log is not None:
            self.log.write(self._stream[fd], chunk)
        if len(buf) > 4 * TAIL:
            del buf[:-TAIL]

    def drain(self, limit: int = 1 << 20) -> None:
        """Read what is left in the pipes now that the handler is gone (at most ``limit``
        bytes a pipe: a leftover may still be writing).

        The read ends are blocking: one ``poll`` tells which hold data (each then read
        once a round) and which no process writes to any more (``POLLHUP`` alone: closed
        unread), so a handler that wrote nothing costs one system call, not a read each.
        """
        if not self._open:
            return
        poller = select.poll()
        rounds = {}
        for fd in self._open:
            poller.register(fd, select.POLLIN)
            rounds[fd] = max(1, limit // 65536)
        while self._open:
            events = poller.poll(0)
            if not events:
                return
            for fd, event in events:
                if fd not in self._open:
                    poller.unregister(fd)
                    continue
                if event & select.POLLIN and rounds[fd] > 0:
                    rounds[fd] -= 1
                    if self._readable(fd):
                        continue
                elif event & select.POLLIN:  # read ``limit`` bytes: leave the rest
                    poller.unregister(fd)
                    continue
                poller.unregister(fd)
                self._close_fd(fd)

    def _close_fd(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            if fd in self._raw or self._reading or fd in self._live:
                self._unwatch(fd)
            os.close(fd)
            if fd in self._redactors:  # what was held back: no secret completes it now
                self._append(fd, self._redactors.pop(fd).end())

    def close(self) -> None:
        """Close every descriptor, stop watching, remove the data file, end the token."""
        self._timer.cancel()
        self.child.on_exit = None
        for fd in list(self._open):
            self._close_fd(fd)
        remove_data_file(self.child.data_file)
        reaper.ended(self.child.token)

    def tail(self, fd: int) -> str:
        """The last ``TAIL`` bytes read from ``fd``, decoded."""
        return bytes(self._bufs[fd][-TAIL:]).decode(errors="replace")

    # -- the control channel -----------------------------------------------------------

    def _control(self, buf: bytearray) -> None:
        while (end := buf.find(b"\n")) >= 0:
            line = buf[:end].decode(errors="replace")
            del buf[: end + 1]
            self._line(line)
        if len(buf) > 1 << 20:  # a "line" over 1 MB with no newline: malformed
            self.bad = self.bad or "control line longer than 1 MB"
            buf.clear()

    def _line(self, line: str) -> None:
        try:
            kind, value = control_channel.parse(line)
        except ValueError as exc:
            self.bad = str(exc)
            return
        self.watch.signal()
        # control_channel.parse: goto's value is a str, sleep's a float, checkpoint's a dict
        if kind == "goto":
            self.goto = cast(str, value)
        elif kind == "sleep":
            self.sleep = cast(float, value)
        elif kind == "checkpoint":
            values = cast(dict[str, Any], value)
            self.data.update(values)
            self.last_checkpoint = values
            self._pending.append((dict(self.data), dict(values)))
            if self._storing is None or self._storing.done():
                self._storing = self.loop.create_task(self._store())

    async def _store(self) -> None:
        while self._pending:
            # the data as of this line: a later line read meanwhile is stored by its own turn
            data, values = self._pending.pop(0)
            ok = await asyncio.to_thread(self.checkpoint, data, values)
            if not ok:
                self._pending.clear()
                self.cancel.set("instance taken away during checkpoint")

    async def checkpoints_stored(self) -> None:
        """Wait until every checkpoint read so far is stored (or refused)."""
        while self._storing is not None and not self._storing.done():
            await self._storing
