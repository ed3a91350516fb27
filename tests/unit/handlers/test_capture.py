"""runner.handlers.capture: a ``call`` handler's output reaches its attempt log with the
state's secrets replaced, also a secret written in two pieces (two ``print`` calls)."""

from __future__ import annotations

from runner.handlers import capture
from runner.log_buffer import END, STDERR, STDOUT, AttemptLog

SECRET = "tok-9f8e7d6c"


class _Queue:
    def queue(self, item: AttemptLog) -> None:
        pass


def _text(log: AttemptLog) -> dict[int, bytes]:
    rows, _, _ = log.take()
    out: dict[int, bytes] = {STDOUT: b"", STDERR: b""}
    for _seq, stream, _at, _offset, data in rows:
        if stream != END:
            out[stream] += bytes(data)
    return out


def _sink(*secrets: str) -> tuple[capture.Sink, AttemptLog]:
    log = AttemptLog(_Queue(), 1, 1, 1 << 20)
    log.secrets = secrets
    return capture.Sink(log), log


def test_a_secret_written_in_two_pieces_is_masked_on_each_stream() -> None:
    sink, log = _sink(SECRET)
    for stream in (STDOUT, STDERR):
        sink.write(stream, "key: " + SECRET[:5])
        sink.write(stream, SECRET[5:] + " ok\n")
    sink.write(STDOUT, "tail " + SECRET[:3])  # the stream ends on a piece of it
    sink.end()
    out = _text(log)
    assert out[STDOUT] == b"key: *** ok\ntail tok"
    assert out[STDERR] == b"key: *** ok\n"


def test_without_secrets_text_goes_through_at_once() -> None:
    sink, log = _sink()
    sink.write(STDOUT, "tok-9f8")
    assert _text(log)[STDOUT] == b"tok-9f8"
    sink.end()
    sink.end()  # idempotent


def test_a_record_logged_inside_a_handler_reaches_the_daemons_log_redacted() -> None:
    """The daemon's JSON log handler with its filter: message and traceback redacted inside
    a handler's context, a record outside it untouched."""
    import io
    import json
    import logging

    from runner.service.logs import JsonFormatter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(capture.RedactRecords())
    logger = logging.getLogger("tests.capture.daemon_log")
    logger.addHandler(handler)
    logger.propagate = False
    sink, _ = _sink(SECRET)
    try:
        token = capture.current.set(sink)
        try:
            raise ValueError("bad " + SECRET)
        except ValueError:
            logger.exception("login with %s failed", SECRET)
        capture.current.reset(token)
        logger.warning("outside %s", "tok-1")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert SECRET not in out.getvalue()
    assert first["msg"].startswith("login with *** failed\nTraceback")
    assert first["msg"].endswith("ValueError: bad ***")
    assert second["msg"] == "outside tok-1"
