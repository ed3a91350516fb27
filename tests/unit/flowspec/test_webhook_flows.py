"""Webhook sensors in flow files: the path's shape, exactly one way to authenticate
(``runner.flowspec.spec_sensors.WebhookSpec``), one sensor per path across the folder
(``runner.flowspec.webhook_checks``), dotted ``match`` keys and ``{event.body.x}``; and
``flowrun check`` saying so with a position and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import FlowErrors
from runner.flowspec.compiler import compile_source
from runner.flowspec.registry import FlowRegistry

ROOT = Path(__file__).resolve().parents[3]

FLOW = """\
initial: work
states:
  work: {exec: [x], next: done}
  done: {terminal: true}
sensors:
  deploy:
    webhook: {path: /hooks/deploy, token_env: DEPLOY_TOKEN}
rules:
  - when: deploy
    match: {body.ref: main, headers.x-github-event: push}
    start: FLOWNAME
    data: {ref: "{event.body.ref}"}
"""


def _errors(source: str) -> list[str]:
    with pytest.raises(FlowErrors) as caught:
        compile_source(source, "f.yaml")
    return [f"{e.line}:{e.col}: {e.message}" for e in caught.value.errors]


def test_a_webhook_sensor_compiles_with_dotted_match_keys() -> None:
    flow = compile_source(FLOW.replace("FLOWNAME", "f"), "f.yaml")
    hook = flow.sensors["deploy"].webhook
    assert (hook.path, hook.token_env, hook.hmac) == ("/hooks/deploy", "DEPLOY_TOKEN", None)
    assert flow.sensors["deploy"].kind == "webhook"


@pytest.mark.parametrize(
    ("webhook", "message"),
    [
        ("{path: hooks/x, token_env: T}", "a webhook path starts with '/' (e.g. /hooks/x)"),
        ("{path: /x}", "exactly one of token_env, hmac (or unauthenticated: true) (got: none)"),
        (
            "{path: /x, token_env: T, hmac: {secret_env: S}}",
            "exactly one of token_env, hmac (or unauthenticated: true) (got: token_env, hmac)",
        ),
        ("{path: /x, token_env: not-a-name}", "token_env"),
    ],
)
def test_a_bad_webhook_is_one_positioned_error(webhook: str, message: str) -> None:
    source = FLOW.replace("FLOWNAME", "f").replace(
        "{path: /hooks/deploy, token_env: DEPLOY_TOKEN}", webhook
    )
    errors = _errors(source)
    assert len(errors) == 1, errors
    assert errors[0].startswith("7:") and message in errors[0], errors


def test_an_unknown_event_field_names_the_webhook_fields() -> None:
    errors = _errors(FLOW.replace("FLOWNAME", "f").replace("{event.body.ref}", "{event.ref}"))
    assert any("{event.ref} is not a field of webhook sensor 'deploy'" in e for e in errors)
    assert any("(fields: body, headers)" in e for e in errors)


def test_one_path_one_sensor_across_the_folder(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("flow: a\n" + FLOW.replace("FLOWNAME", "a"))
    (tmp_path / "b.yaml").write_text("flow: b\n" + FLOW.replace("FLOWNAME", "b"))
    errors = FlowRegistry(tmp_path).load_all()
    shown = [f"{Path(e.file).name}:{e.line}:{e.col}: {e.message}" for e in errors]
    assert shown == [
        "b.yaml:8:21: webhook path '/hooks/deploy' is already served by sensor 'deploy' of "
        "a.yaml: each path belongs to one webhook sensor"
    ]
    res = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--flows", str(tmp_path), "check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "b.yaml:8:21: webhook path '/hooks/deploy' is already served" in res.stderr + res.stdout
