"""A ``call`` handler's output, routed to its attempt's log: ``ctx.log``, ``print``, logging.

A ``call`` handler runs inside the daemon, beside other handlers running at the same
time, so its output is told apart by a context variable (:data:`current`) holding its
attempt's :class:`Sink` (its ``AttemptLog``, ``runner.store.log_writer``, and the
state's secrets): set in the attempt's own task for an async handler, in a copy of the
context its thread runs in for a sync one (:func:`in_context`). Concurrent handlers never
mix: each task and thread sees its own.

Once :func:`install` ran (the first ``call`` attempt with capture on):

- ``sys.stdout`` and ``sys.stderr`` are wrapped: what is written to them from inside a
  handler goes to its attempt's log (stream stdout or stderr), anything else to the
  stream as before;
- the root logger gets a handler that copies every record logged from inside a handler
  (any logger) to its attempt's log, on stderr, as ``LEVEL name: message``;
- secret values of the state (``ctx.secrets``) are written as ``***``, also one written
  in pieces (two ``print`` calls, two records): each stream goes through a
  ``runner.handlers.redact.Redactor``, which holds back an end that could begin a secret;
- a record logged from inside a handler that also reaches the daemon's own log has the
  secrets replaced there too (:class:`RedactRecords`, a filter on the daemon's handler);
- ``ctx.log`` (:func:`handler_logger`) is the logger ``flowrun.handler.<flow>.<state>``:
  its records go to the attempt's log only (not the daemon's own log).

Threads a handler starts itself do not inherit the variable: what they print is not its.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from runner.handlers.redact import Redactor, redact_text
from runner.log_buffer import STDERR, STDOUT, AttemptLog


class Sink:
    """One ``call`` attempt's output on its way to its :class:`AttemptLog` ``log``: what is
    written on each stream goes through a :class:`Redactor` of ``log.secrets`` (a secret
    split across two writes is found; the end of a write that could begin one waits for
    the next write or :meth:`end`). Safe from any thread."""

    __slots__ = ("log", "secrets", "_redactors", "_lock")

    def __init__(self, log: AttemptLog) -> None:
        self.log = log
        self.secrets = log.secrets
        self._redactors: dict[int, Redactor] = {}
        self._lock = threading.Lock()

    def write(self, stream: int, text: str) -> None:
        """Add ``text`` written on ``stream`` (``STDOUT``/``STDERR``), secrets redacted."""
        data = text.encode("utf-8", "backslashreplace")
        if not self.secrets:
            self.log.write(stream, data)
            return
        with self._lock:  # in order: what one write held back goes before the next
            redactor = self._redactors.get(stream)
            if redactor is None:
                redactor = self._redactors[stream] = Redactor(_secret_bytes(self.secrets))
            self.log.write(stream, redactor.feed(data))

    def end(self) -> None:
        """The attempt is over: what was held back is written (no secret completes it now)
        and the log ended. Idempotent."""
        with self._lock:
            for stream, redactor in self._redactors.items():
                self.log.write(stream, redactor.end())
            self._redactors.clear()
        self.log.end()


def _secret_bytes(secrets: tuple[str, ...]) -> set[bytes]:
    """Each secret as a handler's text would be written: UTF-8, a byte that is not (read
    with ``surrogateescape``) either as itself or as ``\\udcXX`` (``backslashreplace``)."""
    ways = ("surrogateescape", "backslashreplace")
    return {s.encode("utf-8", how) for s in secrets for how in ways}


#: The sink of the handler running in this task or thread (``None``: none).
current: contextvars.ContextVar[Sink | None] = contextvars.ContextVar(
    "flowrun_attempt_log", default=None
)

#: The parent of every ``ctx.log`` logger: does not propagate to the daemon's log.
HANDLER_LOGGER = "flowrun.handler"

_FORMAT = logging.Formatter("%(levelname)s %(name)s: %(message)s")
_installed = False
_install_lock = threading.Lock()


class _Stream:
    """``sys.stdout``/``sys.stderr`` wrapped: a handler's writes go to its attempt log."""

    def __init__(self, real: Any, stream: int) -> None:
        self._real = real
        self._stream = stream

    def write(self, text: str) -> int:
        sink = current.get()
        if sink is None:
            return self._real.write(text)
        sink.write(self._stream, text)
        return len(text)

    def flush(self) -> None:
        if current.get() is None:
            self._real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _Route(logging.Handler):
    """Copies a record logged inside a handler to its attempt log (stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        sink = current.get()
        if sink is not None:
            try:
                line = _FORMAT.format(record) + "\n"
            except Exception:  # noqa: BLE001 - a bad format string is the handler's
                line = f"{record.levelname} {record.name}: {record.msg!r}\n"
            sink.write(STDERR, line)


class RedactRecords(logging.Filter):
    """A filter for the daemon's own log handlers: a record logged from inside a ``call``
    handler whose state has secrets (a library's logger, ``logging.warning``, a
    ``flowrun.*`` logger) has them replaced by ``***`` in its message and traceback
    before any handler formats it. Other records pass unchanged; none is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        sink = current.get()
        if sink is None or not sink.secrets:
            return True
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is the handler's
            text = f"{record.msg!r} % {record.args!r}"
        if record.exc_info:
            text += "\n" + _FORMAT.formatException(record.exc_info)
        if record.stack_info:
            text += "\n" + record.stack_info
        record.msg, record.args = redact_text(text, sink.secrets), None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def install() -> None:
    """Wrap ``sys.stdout``/``sys.stderr`` and add the routing handler to the root logger
    and to :data:`HANDLER_LOGGER` (once per process; idempotent). Raises nothing."""
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        if not isinstance(sys.stdout, _Stream):
            sys.stdout = _Stream(sys.stdout, STDOUT)
        if not isinstance(sys.stderr, _Stream):
            sys.stderr = _Stream(sys.stderr, STDERR)
        route = _Route(logging.DEBUG)
        logging.getLogger().addHandler(route)
        parent = logging.getLogger(HANDLER_LOGGER)
        parent.propagate = False
        parent.setLevel(logging.DEBUG)
        parent.addHandler(route)
        _installed = True


def handler_logger(flow: str, state: str) -> logging.Logger:
    """``ctx.log`` of a handler of ``flow``'s ``state``: ``flowrun.handler.<flow>.<state>``
    (records go to the attempt log of the handler that logs them)."""
    return logging.getLogger(f"{HANDLER_LOGGER}.{flow}.{state}")


def in_context(sink: Sink, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` to run in a thread with :data:`current` set to ``sink`` (a sync handler)."""
    context = contextvars.copy_context()
    context.run(current.set, sink)
    return lambda *args: context.run(func, *args)
