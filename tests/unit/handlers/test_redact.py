"""runner.handlers.redact: secrets replaced in a chunked byte stream, whatever the chunk
boundaries; and in texts and JSON-like values."""

from __future__ import annotations

import random
import re

import pytest

from runner.handlers.redact import Redactor, redact_text, redact_value


def run(secrets: list[bytes], chunks: list[bytes]) -> bytes:
    r = Redactor(secrets)
    return b"".join(r.feed(c) for c in chunks) + r.end()


def test_a_secret_split_across_chunks_is_replaced() -> None:
    assert run([b"hunter2"], [b"pw: hun", b"ter2!\n"]) == b"pw: ***!\n"
    assert run([b"hunter2"], [b"h", b"u", b"n", b"t", b"e", b"r", b"2"]) == b"***"


def test_a_start_that_never_completes_is_kept_at_the_end() -> None:
    r = Redactor([b"hunter2"])
    assert r.feed(b"a hunt") == b"a "  # "hunt" could still become the secret
    assert r.end() == b"hunt"


def test_longer_secret_wins_and_empty_ones_are_ignored() -> None:
    assert run([b"ab", b"abcd", b""], [b"xabcdyab"]) == b"x***y***"
    assert run([b""], [b"data"]) == b"data"
    assert run([], [b"data", b"more"]) == b"datamore"


@pytest.mark.parametrize("seed", range(30))
def test_any_chunking_gives_the_same_as_the_whole_stream(seed: int) -> None:
    rnd = random.Random(seed)
    secrets = [bytes(rnd.choice(b"ab") for _ in range(rnd.randint(1, 5))) for _ in range(3)]
    stream = bytes(rnd.choice(b"abc") for _ in range(200))  # many near misses
    cuts = sorted(rnd.sample(range(1, len(stream)), 20))
    chunks = [stream[i:j] for i, j in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    longest_first = sorted(set(secrets), key=len, reverse=True)
    whole = re.sub(b"|".join(re.escape(s) for s in longest_first), b"***", stream)
    assert run(secrets, chunks) == whole
    assert run(secrets, [stream]) == whole


def test_texts_and_values() -> None:
    assert redact_text("key hunter2 and hunter2", ["hunter2", ""]) == "key *** and ***"
    value = {"a": ["x hunter2", 3, {"hunter2": None}], "b": True}
    assert redact_value(value, ("hunter2",)) == {"a": ["x ***", 3, {"***": None}], "b": True}
    assert redact_value(value, ()) is value
