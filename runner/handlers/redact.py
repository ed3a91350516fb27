"""Secret values replaced by ``***`` in a handler's output and in the texts kept of it.

A secret's bytes must never be stored or shown: a handler that prints one has every
copy kept of its output (the error text's tail, checkpoints, ...) carry ``***`` instead.
:class:`Redactor` works on a byte stream that comes in chunks: a secret split across two
chunks is still found, by holding back the end of a chunk that could be the start of a
secret until the next chunk (or the end of the stream) tells. Byte-exact matching; pure
(no I/O), so any reader of a handler's output can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = b"***"
"""What a secret's bytes become."""
_MASK_TEXT = MASK.decode()


class Redactor:
    """Replace every occurrence of any of ``secrets`` in a chunked byte stream.

    Feed the chunks in order to :meth:`feed` (each call returns the bytes that are safe
    to keep so far) and call :meth:`end` once at the end of the stream (the bytes held
    back). The concatenation of the returned bytes is the whole stream with each secret
    (leftmost first, the longer one where two start at the same byte) replaced by
    ``***``. Empty secrets are ignored.
    """

    __slots__ = ("_pattern", "_secrets", "_longest", "_held")

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._pattern = (
            re.compile(b"|".join(re.escape(s) for s in self._secrets)) if self._secrets else None
        )
        self._longest = len(self._secrets[0]) if self._secrets else 0
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The redacted bytes of ``chunk`` that no later chunk can change (some of its end
        may be held back for the next call)."""
        if self._pattern is None:
            return chunk
        data = self._held + chunk if self._held else bytes(chunk)
        # From ``start`` on, the data could be the beginning of a secret that the next
        # chunk completes: no match may start there yet. Before it, the matches are
        # those of the whole stream (one that runs past ``start`` ends within ``data``).
        start = len(data) - self._partial_suffix(data)
        out: list[bytes] = []
        pos = 0
        for match in self._pattern.finditer(data):
            if match.start() >= start:
                break
            out += (data[pos : match.start()], MASK)
            pos = match.end()
        cut = max(start, pos)
        out.append(data[pos:cut])
        self._held = data[cut:]
        return b"".join(out)

    def end(self) -> bytes:
        """The bytes held back, redacted: the stream has ended, no secret completes now."""
        held, self._held = self._held, b""
        return self._pattern.sub(MASK, held) if self._pattern is not None and held else held

    def _partial_suffix(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that is the beginning (not the whole)
        of a secret: 0 when none is."""
        for size in range(min(self._longest - 1, len(data)), 0, -1):
            tail = data[len(data) - size :]
            if any(len(s) > size and s.startswith(tail) for s in self._secrets):
                return size
        return 0


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret in ``secrets`` replaced by ``***`` (empty ones ignored)."""
    return _redact(text, _longest_first(secrets))


def redact_value(value: object, secrets: tuple[str, ...]) -> object:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string redacted by
    :func:`redact_text`; the same object when there is nothing to replace."""
    if not secrets:
        return value
    return _redact_value(value, _longest_first(secrets))


def _longest_first(secrets: Iterable[str]) -> tuple[str, ...]:
    """The secrets in the order they are replaced: the longer first, empty ones left out."""
    return tuple(sorted((s for s in secrets if s), key=len, reverse=True))


def _redact(text: str, ordered: tuple[str, ...]) -> str:
    for secret in ordered:
        text = text.replace(secret, _MASK_TEXT)
    return text


def _redact_value(value: object, ordered: tuple[str, ...]) -> object:
    """:func:`redact_value` with the secrets already ordered (once for a whole value, not
    for each string in it)."""
    if isinstance(value, str):
        return _redact(value, ordered)
    if isinstance(value, dict):
        return {_redact(k, ordered): _redact_value(v, ordered) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_value(v, ordered) for v in value]
    return value
