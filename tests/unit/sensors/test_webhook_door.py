"""The webhook door behind a real ``HttpListener`` (real HTTP on 127.0.0.1, real SQLite
and PostgreSQL): secrets read from the environment at each request (an unset one is a
WARNING once and 401), signatures with another header, two listeners on one PostgreSQL
database (two daemons of a fleet) each storing what they answered, no lease needed."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from runner.flowspec.registry import FlowRegistry
from runner.sensors.webhook import WebhookDoor
from runner.service.http_listener import HttpListener
from tests.support.fault import either_world, sql

FLOW = """\
initial: a
states:
  a: {external: true, on: {go: done}}
  done: {terminal: true}
sensors:
  deploy: {webhook: {path: /d, token_env: WH_TOKEN}}
  signed: {webhook: {path: /s, hmac: {secret_env: WH_KEY, header: X-Sig}}}
  open: {webhook: {path: /o, unauthenticated: true}}
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request, tmp_path: Path) -> Iterator[tuple[Engine, FlowRegistry]]:
    engine, _flow = either_world(request, tmp_path, "wh", FLOW)
    registry = FlowRegistry(tmp_path / "flows")
    assert registry.load_all() == []
    try:
        yield engine, registry
    finally:
        engine.dispose()


def _listen(door: WebhookDoor) -> HttpListener:
    listener = HttpListener("127.0.0.1", 0, door=door)
    listener.start()
    return listener


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers)
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


def _stored(engine: Engine) -> list[tuple]:
    return sql(engine, "SELECT id, sensor FROM events ORDER BY id")


def test_an_unset_secret_is_one_warning_and_401(world, caplog) -> None:
    engine, registry = world
    env: dict[str, str] = {}
    listener = _listen(WebhookDoor(engine, registry, environ=env))
    try:
        with caplog.at_level(logging.WARNING, logger="flowrun.sensors"):
            for _ in range(2):
                status, _doc = _post(listener.port, "/d", b"{}", {"Authorization": "Bearer "})
                assert status == 401
        warned = [r.getMessage() for r in caplog.records if "WH_TOKEN" in r.getMessage()]
        assert len(warned) == 1 and "is not set" in warned[0]
        assert _stored(engine) == []
        env["WH_TOKEN"] = "now-set"  # read at each request: no restart needed
        status, doc = _post(listener.port, "/d", b"{}", {"Authorization": "Bearer now-set"})
        assert status == 202 and _stored(engine) == [(doc["event"], "wh.deploy")]
    finally:
        listener.close()


def test_a_signature_in_another_header(world) -> None:
    engine, registry = world
    door = WebhookDoor(engine, registry, environ={"WH_KEY": "k"})
    listener = _listen(door)
    body = b'{"a": 1}'
    good = "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    try:
        assert _post(listener.port, "/s", body, {"X-Hub-Signature-256": good})[0] == 401
        assert _post(listener.port, "/s", body + b" ", {"X-Sig": good})[0] == 401
        status, doc = _post(listener.port, "/s", body, {"X-Sig": good, "X-Other": "1"})
        assert status == 202
    finally:
        listener.close()
    (payload,) = [r[0] for r in sql(engine, "SELECT payload FROM events")]
    payload = payload if isinstance(payload, dict) else json.loads(payload)
    assert payload["body"] == {"a": 1} and payload["headers"]["x-other"] == "1"
    assert "x-sig" not in payload["headers"]


def test_two_listeners_one_database_each_store_what_they_answer(world) -> None:
    engine, registry = world
    env = {"WH_TOKEN": "t"}
    one = _listen(WebhookDoor(engine, registry, environ=env))
    two = _listen(WebhookDoor(engine, registry, environ=env))
    try:
        ids = [
            _post(listener.port, "/d", b"[]", {"Authorization": "Bearer t"})[1]["event"]
            for listener in (one, two, one, two)
        ]
    finally:
        one.close()
        two.close()
    assert [r[0] for r in _stored(engine)] == ids and len(set(ids)) == 4


def test_an_unauthenticated_webhook_beyond_loopback_is_403(world) -> None:
    engine, registry = world
    listener = _listen(WebhookDoor(engine, registry, exposed=True))
    try:
        assert _post(listener.port, "/o", b"{}", {})[0] == 403
    finally:
        listener.close()
    listener = _listen(WebhookDoor(engine, registry))
    try:
        assert _post(listener.port, "/o", b"{}", {})[0] == 202
    finally:
        listener.close()
