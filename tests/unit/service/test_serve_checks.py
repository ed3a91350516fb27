"""The checks of ``runner.service.serve_guard``: which Host and Origin headers name the
served address, and which tokens are accepted; and which browser messages a session
passes on (``runner.service.serve.envelope``)."""

from __future__ import annotations

import pytest

from runner.errors import UserError
from runner.service.serve_guard import Guard, checked_token


def test_a_loopback_bind_admits_loopback_names_only() -> None:
    guard = Guard("127.0.0.1", 8765, "x" * 16)
    for name in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2", "LOCALHOST"):
        assert guard.host_allowed(name), name
    for name in ("evil.example", "10.0.0.1", "127.0.0.1.nip.io", ""):
        assert not guard.host_allowed(name), name
    assert Guard("127.0.0.1", 8765, "x" * 16, ["console.lan"]).host_allowed("console.lan")


def test_another_bind_admits_addresses_and_its_names() -> None:
    guard = Guard("10.1.2.3", 8765, "x" * 16, ["console.example.org"])
    assert guard.host_allowed("10.1.2.3") and guard.host_allowed("192.168.0.9")
    assert guard.host_allowed("console.example.org")
    assert not guard.host_allowed("evil.example")


def test_the_origin_must_be_the_hosts_own() -> None:
    same = Guard.same_origin
    assert same("http://127.0.0.1:8765", "127.0.0.1:8765")
    assert same("https://console.example.org", "console.example.org")
    assert same("https://console.example.org", "console.example.org:443")
    assert not same("http://console.example.org", "console.example.org:443")
    assert not same("http://evil.example", "127.0.0.1:8765")
    assert not same("http://127.0.0.1:8766", "127.0.0.1:8765")
    assert not same("null", "127.0.0.1:8765")
    assert not same("file://", "127.0.0.1:8765")


def test_tokens_are_long_or_generated() -> None:
    token, generated = checked_token(None)
    assert generated and len(token) >= 32
    assert checked_token(None)[0] != token
    assert checked_token("a" * 16) == ("a" * 16, False)
    with pytest.raises(UserError) as caught:
        checked_token("abc")
    assert caught.value.exit_code == 2


def test_only_the_pages_messages_pass() -> None:
    from runner.service.serve import envelope

    assert envelope('["stdin", "j"]') == ["stdin", "j"]
    assert envelope('["ping", "1"]') == ["ping", "1"]
    assert envelope('["focus"]') == ["focus"]
    assert envelope('["later-kind", 1]') == ["later-kind"]  # ignored, as textual-serve does
    assert envelope('["resize", {"width": 100, "height": 30}]') == [
        "resize",
        {"width": 100, "height": 30},
    ]
    # a size beyond any screen is cut, not passed on
    assert envelope('["resize", {"width": 99999, "height": 0}]') == [
        "resize",
        {"width": 1000, "height": 1},
    ]
    for text in (
        "nope",
        "{}",
        "[]",
        "[1]",
        '["stdin"]',
        '["stdin", 5]',
        '["stdin", "\\ud800"]',
        '["ping", null]',
        '["resize", {"width": 1.5, "height": 30}]',
        '["resize", {"width": true, "height": 30}]',
        '["resize", {"height": 30}]',
    ):
        assert envelope(text) is None, text
