"""The daemon's logs: text for people, JSON lines for machines, fields as keys.

``--log-format json`` prints one object per line: ``ts`` (ISO 8601 UTC), ``level``,
``logger``, ``msg``, plus every field of :data:`FIELDS` the call passed in ``extra=``
(``log.info("...", extra={"instance": 42, "flow": "f"})``), and ``exc`` for a traceback.
The text format appends the same fields as ``key=value`` to the attempt lines. By
default an instance that failed or was paused (its error budget or restarts spent), was
killed, lost an attempt or missed a deadline, an attempt's outcome fenced out and an
alert's delivery that gave up are one WARNING line naming instance, flow and state
(fields ``instance``, ``flow``, ``state``, ``kind``; made by ``runner.warn_line``).
``--log-attempts`` adds one INFO line per finished
attempt with its error line (logger ``flowrun.attempts``; off by default: see
:func:`attempt_logger` for its cost).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from runner.error_line import error_line
from runner.handlers.capture import RedactRecords
from runner.literal import literal

if TYPE_CHECKING:
    from runner.handlers.attempt import AttemptResult
    from runner.store.rows import Claim

#: Structured fields a log call may pass in ``extra=`` (kept as JSON keys).
FIELDS = (
    "instance",
    "instances",
    "flow",
    "state",
    "attempt",
    "worker",
    "holder",
    "event",
    "outcome",
    "to_state",
    "error",
    "kind",
    "seconds",
    "part",
    "sensor",
    "file",
    "line",
    "col",
)

LEVELS = ("debug", "info", "warning", "error")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: record.__dict__[k] for k in FIELDS if k in record.__dict__}


class JsonFormatter(logging.Formatter):
    """One JSON object per log line (see the module doc for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        out: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS LEVEL logger: message`` and the structured fields as ``key=value``; the
    message and fields made literal (``runner.literal``: a worker id, a file name or a
    handler's error line cannot send escape sequences to the terminal reading the log)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging API
        text = super().formatMessage(record)
        fields = _fields(record)
        if fields and record.name == "flowrun.attempts":
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return literal(text, lines=True)


def setup_logging(fmt: str = "text", level: str | int = logging.INFO, attempts: bool = False):
    """Log to stderr as ``text`` or ``json`` at ``level`` (a name of :data:`LEVELS` or a
    ``logging`` number); ``attempts`` turns the per-attempt INFO lines on."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RedactRecords())  # a call handler's secrets never reach this log
    root = logging.getLogger("flowrun")
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    root.propagate = False
    # everything else (asyncio, SQLAlchemy, Python warnings) in the same format, so a
    # JSON log stays JSON
    other = logging.getLogger()
    other.handlers[:] = [handler]
    other.setLevel(logging.WARNING)
    logging.captureWarnings(True)
    logging.getLogger("flowrun.attempts").setLevel(logging.INFO if attempts else logging.WARNING)


ATTEMPTS = logging.getLogger("flowrun.attempts")


def attempt_logger(worker_id: str):
    """The worker's ``on_finished(claim, result)`` hook logging one INFO line per attempt
    (``instance``, ``flow``, ``state``, ``attempt``, ``worker``, ``outcome``,
    ``to_state``, ``seconds`` and, for an attempt with an error, ``error`` (its error
    line, ``runner.error_line``) as fields). A formatted line costs about 10-20 us, so it is
    off by default (``--log-attempts``; figures in README)."""

    def finished(claim: Claim, result: AttemptResult) -> None:
        if not ATTEMPTS.isEnabledFor(logging.INFO):
            return
        spent = time.time() - claim.started_at
        error = error_line(result.error, 300) if result.error else None
        ATTEMPTS.info(
            "instance %d: %s attempt %d %s%s in %.3fs%s",
            claim.id,
            claim.state,
            claim.attempt,
            result.outcome,
            f" -> {result.to_state}" if result.to_state else "",
            spent,
            f": {error}" if error else "",
            extra={
                "instance": claim.id,
                "flow": claim.flow,
                "state": claim.state,
                "attempt": claim.attempt,
                "worker": worker_id,
                "outcome": result.outcome,
                "to_state": result.to_state,
                "seconds": round(spent, 6),
                **({"error": error} if error else {}),
            },
        )

    return finished
