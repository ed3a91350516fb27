"""The database password never reaches the console, logs, errors or ``--help``.

Every path a URL can take to the user is exercised with a password that must not appear:
unreachable servers, unknown databases, malformed URLs, unknown drivers, an unencoded
``@`` in the password, a ``password=`` query parameter, ``FLOWRUN_DB`` in ``--help``, and
a daemon's text and JSON logs (plus ``ls``/``show``/``workers --json``) on a real server.
Each failure is one line on stderr with ``***`` in place of the password and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.store.db import make_engine, redact

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Sup3rSecretPw"


def flowrun(*args: str, env_extra: dict | None = None, cwd: Path | None = None):
    """Run ``flowrun`` as a subprocess; returns the ``CompletedProcess``."""
    script = Path(sys.executable).parent / "flowrun"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "runner.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(env_extra or {})
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def assert_clean_failure(res: subprocess.CompletedProcess, *, secret: str = SECRET) -> str:
    """Non-zero exit, one line on stderr, no traceback, no trace of the password."""
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert secret not in out
    assert secret[2:-2] not in out, "a fragment of the password leaked"
    assert "Traceback" not in out
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


BAD_URLS = [
    # (url, what the error line must say)
    (f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x", "cannot reach database"),
    (f"postgresql://u:{SECRET}@127.0.0.1:1/x", "cannot reach database"),
    (f"postgres://u:{SECRET}@127.0.0.1:1/x", "cannot reach database"),
    (f"postgresql+psycopg://u:{SECRET}@nonexistent.invalid/x", "cannot reach database"),
    (f"postgresql+psycopg://u:{SECRET}@127.0.0.1:notaport/x", "bad database URL"),
    (f"postgresql+psycopg://u:{SECRET}@[::1/x", "bad database URL"),
    (f"postgresql+nodriver://u:{SECRET}@h/x", "bad database URL"),
    (f"u:{SECRET}@somehost/x", "bad database URL"),
    (f"postgresql+psycopg//u:{SECRET}@h/x", "bad database URL"),
    (f"postgresql+psycopg://u:{SECRET[:5]}@{SECRET[5:]}@127.0.0.1:1/x", "%40"),
    (f"postgresql+psycopg://u@127.0.0.1:1/x?password={SECRET}", "cannot reach database"),
]


@pytest.mark.parametrize("url,says", BAD_URLS, ids=range(len(BAD_URLS)))
def test_bad_url_is_one_redacted_line(url, says, tmp_path):
    res = flowrun("--db", url, "ls", cwd=tmp_path)
    line = assert_clean_failure(res)
    assert line.startswith("flowrun: ") and says in line
    assert "***" in line


@pytest.mark.parametrize("url,says", BAD_URLS[:3], ids=range(3))
def test_bad_url_from_environment(url, says, tmp_path):
    res = flowrun("ls", "--json", env_extra={"FLOWRUN_DB": url}, cwd=tmp_path)
    line = assert_clean_failure(res)
    assert says in line and "***" in line


def test_daemon_with_unreachable_database_is_one_line(tmp_path):
    (tmp_path / "flows").mkdir()
    res = flowrun(
        "--db",
        f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x",
        "--flows",
        str(tmp_path / "flows"),
        "--daemon",
        "--exit-when-idle",
        "--log-format",
        "json",
        cwd=tmp_path,
    )
    line = assert_clean_failure(res)
    assert "cannot reach database" in line and "***" in line


@pytest.mark.parametrize("command", [[], ["ls"], ["workers"], ["show"]])
def test_help_never_shows_the_password(command, tmp_path):
    url = f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x"
    res = flowrun(*command, "--help", env_extra={"FLOWRUN_DB": url}, cwd=tmp_path)
    assert res.returncode == 0
    assert SECRET not in res.stdout + res.stderr


@pytest.mark.parametrize(
    "url,shown",
    [
        ("postgresql+psycopg://u:pw@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql+psycopg://u:p%40w@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql+psycopg://u:p@w@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql+psycopg://u@h/db?password=pw&x=1", "postgresql+psycopg://u@h/db?"),
        ("u:pw@h", "u:***@h"),
        ("sqlite:///a/b.db", "sqlite:///a/b.db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_redact(url, shown):
    out = redact(url)
    assert out.startswith(shown)
    assert "pw" not in out.replace("psycopg", "")
    assert "p@w" not in out and "p%40w" not in out


def test_make_engine_error_is_redacted():
    with pytest.raises(ConfigError) as info:
        make_engine(f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x")
    assert SECRET not in str(info.value) and "***" in str(info.value)


@pytest.mark.postgres
def test_wrong_database_on_real_server_is_redacted(pg_url, tmp_path):
    base = pg_url.rpartition("/")[0].replace("://postgres@", f"://postgres:{SECRET}@")
    res = flowrun("--db", f"{base}/no_such_database_here", "ls", cwd=tmp_path)
    line = assert_clean_failure(res)
    assert "does not exist" in line and "postgres:***@" in line


FLOW = """\
flow: tiny
initial: a
states:
  a: {call: "tiny_tasks:go", next: b}
  b: {call: "tiny_tasks:fail_once", next: done}
  done: {terminal: true}
defaults:
  backoff: {initial: 0s, factor: 1, max: 0s, jitter: none}
"""

TASKS = """\
import logging


async def go(ctx):
    logging.getLogger("flowrun.test").warning("handler for %s", ctx.instance_id)
    return True


def fail_once(ctx):
    if ctx.attempt % 3 == 2:
        raise RuntimeError("a handler error, logged by the worker")
    return True
"""


@pytest.mark.postgres
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_daemon_logs_and_outputs_never_show_the_password(pg_url, tmp_path, log_format):
    url = pg_url.replace("://postgres@", f"://postgres:{SECRET}@")
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "tiny.yaml").write_text(FLOW)
    (flows / "tiny_tasks.py").write_text(TASKS)
    env = {"FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    outputs = []
    for _ in range(3):
        res = flowrun("start", "tiny", "n=1", env_extra=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        outputs.append(res)
    res = flowrun(
        "--daemon",
        "--exit-when-idle",
        "--worker-id",
        "redaction-test",
        "--log-format",
        log_format,
        env_extra=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "worker redaction-test started" in res.stderr
    outputs.append(res)
    for args in (["ls", "--json"], ["show", "1", "--json"], ["workers", "--json"], ["ls"]):
        out = flowrun(*args, env_extra=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        outputs.append(out)
    workers = json.loads(outputs[-2].stdout)
    assert [w["id"] for w in workers] == ["redaction-test"]
    for out in outputs:
        assert SECRET not in out.stdout + out.stderr
