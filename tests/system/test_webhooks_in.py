"""Webhooks in (issue 30, item 4): real HTTP requests (``http.client``) to a real daemon
subprocess's listener; each event is stored before the 202, rules start instances from
it, refusals store nothing, a daemon killed right after the 202 has lost nothing."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import re
import signal
from pathlib import Path

import pytest

from runner.store.db import make_engine
from tests.support.fault import Daemon, Flowrun, daemon_running, engine_at, poll, sql, write_flow

pytestmark = pytest.mark.timeout(300)

TOKEN = "deploy-token-never-stored"
GH_KEY = "gh-key-never-stored"

FLOW = """\
initial: work
states:
  work:
    exec: [sh, -c, "echo ran"]
    next: done
  done: {terminal: true}
sensors:
  deploy: {webhook: {path: /hooks/deploy, token_env: DEPLOY_TOKEN}}
  gh: {webhook: {path: /hooks/gh, hmac: {secret_env: GH_SECRET}}}
  open: {webhook: {path: /hooks/open, unauthenticated: true}}
rules:
  - when: deploy
    start: hooked
    data: {ref: "{event.body.ref}"}
  - when: gh
    match: {headers.x-github-event: push}
    start: hooked
    data: {ref: "{event.body.ref}"}
  - when: open
    start: hooked
"""


def _port(daemon: Daemon) -> int:
    """The listener's port, from the daemon's log line (it was given port 0)."""
    found = poll(
        lambda: re.search(r"http listener on http://[^:]+:(\d+)", daemon.log()),
        what="the listener's log line",
    )
    return int(found.group(1))


def _post(
    port: int, path: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST"
) -> tuple[int, dict]:
    """One request; returns (status, JSON answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        res = conn.getresponse()
        return res.status, json.loads(res.read() or b"{}")
    finally:
        conn.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def _sign(body: bytes, key: str = GH_KEY) -> str:
    return "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def _events(engine) -> list[tuple]:
    return sql(engine, "SELECT id, sensor, payload FROM events ORDER BY id")


def _instance_of(engine, event_id: int) -> tuple | None:
    rows = sql(engine, "SELECT status, data FROM instances WHERE event_id = :e", e=event_id)
    return rows[0] if rows else None


def _completed(engine, event_id: int) -> bool:
    row = _instance_of(engine, event_id)
    return row is not None and row[0] == "completed"


def _fleet(tmp_path: Path) -> Flowrun:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "hooked", FLOW)
    fr.env.update(DEPLOY_TOKEN=TOKEN, GH_SECRET=GH_KEY)
    return fr


def test_webhooks_start_instances_and_refusals_store_nothing(tmp_path: Path) -> None:
    fr = _fleet(tmp_path)
    engine = engine_at(tmp_path)
    with daemon_running(fr, "hooks", "--http", "0") as daemon:
        port = _port(daemon)
        body = json.dumps({"ref": "main"}).encode()
        status, doc = _post(port, "/hooks/deploy", body, {**_bearer(TOKEN), "X-Trace": "t1"})
        assert status == 202, doc
        first = doc["event"]
        # stored before the answer: the row is there as soon as the 202 is
        assert [r[0] for r in _events(engine)] == [first]
        poll(lambda: _completed(engine, first), what="the webhook's instance completed")

        # refusals: nothing stored
        for headers in ({}, _bearer("wrong"), {"Authorization": TOKEN}):
            status, doc = _post(port, "/hooks/deploy", body, headers)
            assert status == 401, (headers, doc)
        assert _post(port, "/hooks/gh", body, {"X-Hub-Signature-256": _sign(body, "x")})[0] == 401
        assert _post(port, "/hooks/gh", body, {})[0] == 401
        assert _post(port, "/hooks/deploy", b"{not json", _bearer(TOKEN))[0] == 400
        assert _post(port, "/hooks/deploy", b"\xff\xfe", _bearer(TOKEN))[0] == 400
        assert _post(port, "/hooks/nope", body, _bearer(TOKEN))[0] == 404
        assert _post(port, "/hooks/deploy", b"", _bearer(TOKEN), method="GET")[0] == 405
        huge = b'{"x": "' + b"a" * (5 << 20) + b'"}'
        status, doc = _post(port, "/hooks/deploy", huge, _bearer(TOKEN))
        assert status == 413, doc
        assert len(_events(engine)) == 1

        # the daemon is fine after all that: a signed GitHub-style push, an open hook
        gh = json.dumps({"ref": "refs/heads/main", "after": "abc"}).encode()
        sig = {"X-Hub-Signature-256": _sign(gh), "X-GitHub-Event": "push"}
        status, doc = _post(port, "/hooks/gh", gh, sig)
        assert status == 202, doc
        signed = doc["event"]
        status, doc = _post(port, "/hooks/open", b"[1, 2]", {})
        assert status == 202, doc
        poll(lambda: _completed(engine, signed) and _completed(engine, doc["event"]))
        assert metrics_still_absent(port)

    stored = {r[0]: (r[1], r[2]) for r in _events(engine)}
    assert len(stored) == 3
    sensor, payload = stored[first]
    payload = payload if isinstance(payload, dict) else json.loads(payload)
    assert sensor == "hooked.deploy"
    assert payload["body"] == {"ref": "main"}
    assert payload["headers"]["x-trace"] == "t1"
    assert "authorization" not in payload["headers"]
    gh_payload = stored[signed][1]
    gh_payload = gh_payload if isinstance(gh_payload, dict) else json.loads(gh_payload)
    assert "x-hub-signature-256" not in gh_payload["headers"]
    assert gh_payload["headers"]["x-github-event"] == "push"
    data = _instance_of(engine, signed)[1]
    assert (data if isinstance(data, dict) else json.loads(data))["ref"] == "refs/heads/main"
    raw = (tmp_path / "flowrun.db").read_bytes()
    assert TOKEN.encode() not in raw and GH_KEY.encode() not in raw
    log = daemon.log()
    assert TOKEN not in log and GH_KEY not in log
    # the CLI lists the webhook events with their bodies
    shown = fr("events")
    assert shown.returncode == 0, shown.stderr
    assert 'webhook {"ref":"main"}' in shown.stdout
    # `rules test` reaches into a webhook's nested fields as the rules do
    event = json.dumps({"body": {"ref": "x"}, "headers": {"x-github-event": "ping"}})
    tried = fr("rules", "test", "hooked", "--sensor", "gh", "--event", event, "--json")
    assert tried.returncode == 0, tried.stderr
    assert "x-github-event" in tried.stdout and "push" in tried.stdout
    # `events replay` of a stored webhook event: already acted on, nothing doubled
    again = fr("events", "replay", str(first))
    assert again.returncode == 0, again.stderr
    assert len(sql(engine, "SELECT id FROM instances WHERE event_id = :e", e=first)) == 1


def metrics_still_absent(port: int) -> bool:
    """Without --metrics the listener serves no /metrics (404)."""
    return _post(port, "/metrics", b"", {}, method="GET")[0] == 404


def test_killed_right_after_the_202_a_restart_starts_the_instance(tmp_path: Path) -> None:
    fr = _fleet(tmp_path)
    engine = engine_at(tmp_path)
    daemon = fr.daemon("--http", "0", worker_id="killed")
    try:
        port = _port(daemon)
        status, doc = _post(port, "/hooks/deploy", b'{"ref": "v1"}', _bearer(TOKEN))
        daemon.signal(signal.SIGKILL)
        assert status == 202, doc
        daemon.wait(60)
    finally:
        daemon.stop()
    event_id = doc["event"]
    assert [r[0] for r in _events(engine)] == [event_id]  # stored before the 202
    with daemon_running(fr, "after", "--http", "0"):
        poll(lambda: _completed(engine, event_id), what="the instance after the restart")
    assert len(sql(engine, "SELECT id FROM instances")) == 1


def test_unauthenticated_webhook_refused_beyond_loopback(tmp_path: Path) -> None:
    fr = _fleet(tmp_path)
    res = fr("--daemon", "--http", "0.0.0.0:0", timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("flowrun:")]
    assert len(lines) == 1, res.stderr
    assert re.search(r"hooked\.yaml:\d+:\d+: webhook sensor 'open' is unauthenticated", lines[0])


def test_an_unset_secret_is_a_warning_at_start_and_401(tmp_path: Path) -> None:
    fr = _fleet(tmp_path)
    del fr.env["GH_SECRET"]
    with daemon_running(fr, "unset", "--http", "0") as daemon:
        port = _port(daemon)
        poll(lambda: "environment variable GH_SECRET is not set" in daemon.log())
        body = b"{}"
        assert _post(port, "/hooks/gh", body, {"X-Hub-Signature-256": _sign(body)})[0] == 401
    assert _events(engine_at(tmp_path)) == []


@pytest.mark.postgres
def test_two_postgres_daemons_both_serve_every_webhook(tmp_path: Path, pg_url: str) -> None:
    fr = _fleet(tmp_path)
    fr.db = pg_url
    engine = make_engine(pg_url)
    daemons = [fr.daemon("--http", "0", worker_id=f"pgh{w}", log=f"d{w}") for w in range(2)]
    try:
        ports = [_port(d) for d in daemons]
        ids = []
        for i in range(10):  # alternately to each daemon: no lease decides who may answer
            status, doc = _post(ports[i % 2], "/hooks/deploy", b'{"ref": "r"}', _bearer(TOKEN))
            assert status == 202, doc
            ids.append(doc["event"])
        poll(lambda: all(_completed(engine, e) for e in ids), 120, what="10 instances")
    finally:
        for d in daemons:
            d.signal(signal.SIGINT)
        for d in daemons:
            d.wait(60)
            d.stop()
    assert len(set(ids)) == 10
    assert sorted(r[0] for r in _events(engine)) == sorted(ids)  # each request stored once
    assert len(sql(engine, "SELECT id FROM instances")) == 10  # each started once
    engine.dispose()
