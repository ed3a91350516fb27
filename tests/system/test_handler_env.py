"""A handler gets what it needs and nothing more: its state's ``env`` templates, its
secrets (never stored anywhere), a base environment without the daemon's credentials,
``env_inherit: none``. Real daemon, real handlers, real SQLite file and PostgreSQL."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.fault import Flowrun, poll, write_flow

SECRET = "s3cr3t-Zq8vTXw1"

ENV_FLOW = """\
initial: dump
defaults:
  env: {REGION: "{data.region}", FIXED: plain}
states:
  dump:
    exec: [python, envdump.py, daemon.json]
    env: {FIXED: "state {data.region}"}
    secrets: {TOKEN: {env: H9_TOKEN_SOURCE}}
    next: bare
  bare:
    exec: [python, envdump.py, bare.json]
    env_inherit: none
    next: done
  done: {terminal: true}
"""

ENVDUMP = """\
import json, os, sys
with open(sys.argv[1], "w") as f:
    json.dump(dict(os.environ), f)
"""


def test_env_templates_base_environment_and_env_inherit_none(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "envs", ENV_FLOW, {"envdump": ENVDUMP})
    fr.env["FLOWRUN_DB"] = f"postgresql://flowrun:{SECRET}@db.example/flowrun"
    fr.env["FLOWRUN_SERVE_TOKEN"] = "token-" + SECRET
    fr.env["H9_INHERITED"] = "yes"
    fr.env["H9_TOKEN_SOURCE"] = "tok-" + SECRET
    iid = int(fr("start", "envs", "region=eu-west").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    shown = fr.show(iid)
    assert shown["status"] == "completed"
    names = {a["state"]: (a["env"], a["secrets"]) for a in shown["history"]}
    assert names == {"dump": (["REGION", "FIXED"], ["TOKEN"]), "bare": (["REGION", "FIXED"], [])}
    env = json.loads((fr.flows / "daemon.json").read_text())
    assert env["REGION"] == "eu-west" and env["FIXED"] == "state eu-west"
    assert "FLOWRUN_DB" not in env and "FLOWRUN_SERVE_TOKEN" not in env
    # the secret under its own name only: the variable it is read from is left out
    assert env["TOKEN"] == "tok-" + SECRET and "H9_TOKEN_SOURCE" not in env
    del env["TOKEN"]
    assert SECRET not in json.dumps(env)
    assert env["H9_INHERITED"] == "yes" and env["FLOWRUN_STATE"] == "dump"
    bare = json.loads((fr.flows / "bare.json").read_text())
    assert "H9_INHERITED" not in bare and "FLOWRUN_DB" not in bare
    assert bare["PATH"] and bare["FLOWRUN_STATE"] == "bare" and bare["REGION"] == "eu-west"
    assert set(bare) <= {"PATH", "HOME", "LANG", "TZ", "PYTHONPATH", "REGION", "FIXED"} | {
        k for k in bare if k.startswith("FLOWRUN_")
    }


@pytest.mark.postgres
def test_no_database_url_of_the_daemon_reaches_a_handler(tmp_path: Path, pg_url: str) -> None:
    """On PostgreSQL, with the password in FLOWRUN_DB and FLOWRUN_LISTEN_DB (both used by
    the daemon), the handler's environment has neither variable nor the password."""
    fr = Flowrun(tmp_path)
    url = pg_url.replace("://postgres@", f"://postgres:{SECRET}@")
    assert SECRET in url
    fr.db = url
    fr.env["FLOWRUN_DB"] = url
    fr.env["FLOWRUN_LISTEN_DB"] = url
    write_flow(fr.flows, "envs", ENV_FLOW, {"envdump": ENVDUMP})
    fr.env["H9_TOKEN_SOURCE"] = "tok"
    iid = int(fr("start", "envs", "region=eu-west").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    assert fr.show(iid)["status"] == "completed"
    for dump in ("daemon.json", "bare.json"):
        env = json.loads((fr.flows / dump).read_text())
        assert "FLOWRUN_DB" not in env and "FLOWRUN_LISTEN_DB" not in env, sorted(env)
        assert SECRET not in json.dumps(env), dump


SECRET_FLOW = """\
initial: leak
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
  secrets: {API_KEY: {file: api.key}}
states:
  leak: {exec: [python, leak.py], next: done}
  done: {terminal: true}
"""

LEAK = """\
import os, sys, time
from runner.control import checkpoint
s = os.environ["API_KEY"]
half = len(s) // 2
for stream in (sys.stdout, sys.stderr):
    stream.write("the key: " + s[:half]); stream.flush()
    time.sleep(0.3)  # two writes, read as two chunks
    stream.write(s[half:] + " (printed)\\n"); stream.flush()
checkpoint({"seen": "key=" + s})
sys.exit(3)
"""

CALL_FLOW = """\
initial: boom
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  boom:
    call: "boom_tasks:boom"
    secrets: {API_KEY: {env: H9_API_KEY}}
    next: done
  done: {terminal: true}
"""

BOOM = """\
import logging
import sys


def boom(ctx):
    s = ctx.secrets["API_KEY"]
    half = len(s) // 2
    for stream in (sys.stdout, sys.stderr):  # two writes: its attempt log sees both
        stream.write("call key: " + s[:half])
        stream.write(s[half:] + " (printed)\\n")
    ctx.log.warning("logged %s", s)
    # records that also reach the daemon's log (the root logger's, flowrun's)
    logging.getLogger("some.lib").warning("lib %s", s)
    logging.getLogger("flowrun.boom").warning("flowrun-side %s", s)
    try:
        raise ValueError("bad key " + s)
    except ValueError:
        logging.getLogger("some.lib").exception("failed")
    ctx.data["copied"] = s
    raise RuntimeError("cannot log in with " + s)
"""


def _run_secret_flows(fr: Flowrun) -> tuple[int, int, list[str]]:
    """Both flows run to ``failed``; returns their ids and every text flowrun showed."""
    write_flow(fr.flows, "leaky", SECRET_FLOW, {"leak": LEAK})
    write_flow(fr.flows, "calls", CALL_FLOW, {"boom_tasks": BOOM})
    (fr.flows / "api.key").write_text(SECRET + "\n")
    fr.env["H9_API_KEY"] = SECRET
    leak = int(fr("start", "leaky").stdout)
    boom = int(fr("start", "calls").stdout)
    res = fr("--daemon", "--exit-when-idle", "--log-attempts", timeout=120)
    assert res.returncode == 0, res.stderr
    shown = [res.stdout, res.stderr]
    for line in ("WARNING some.lib: lib ***", "flowrun-side ***", "ValueError: bad key ***"):
        assert line in res.stderr, res.stderr  # the daemon's log: its records, redacted
    for args in (
        ("ls", "--json"),
        ("ls",),
        ("show", str(leak), "--json"),
        ("show", str(leak)),
        ("show", str(boom), "--json"),
        ("explain", str(leak), "--json"),
        ("explain", str(boom)),
        ("events", "--json"),
        ("logs", str(leak)),
        ("logs", str(boom), "--json"),
        ("logs", str(boom), "--raw"),
    ):
        out = fr(*args)
        assert out.returncode == 0, (args, out.stderr)
        shown += [out.stdout, out.stderr]
    return leak, boom, shown


def _assert_hidden(fr: Flowrun, leak: int, boom: int, shown: list[str]) -> None:
    for text in shown:
        assert SECRET not in text
    assert fr.show(leak)["status"] == "failed" and fr.show(boom)["status"] == "failed"
    text = json.dumps(fr.show(leak))
    assert "the key: ***" in text, text  # split across two writes, still found
    assert "key=***" in text  # the checkpoint too
    assert "cannot log in with ***" in json.dumps(fr.show(boom))
    assert fr.show(boom)["history"][0]["secrets"] == ["API_KEY"]  # the name, not the value
    assert "handler of leak gets env: -; secrets: API_KEY" in fr("show", str(leak)).stdout
    # the captured logs: an exec handler's pipes and a call handler's prints and records
    assert fr("logs", str(leak)).stdout.count("the key: *** (printed)") == 2
    logged = fr("logs", str(boom), "--raw").stdout
    assert logged.count("call key: *** (printed)\n") == 2, logged
    assert "logged ***" in logged


def test_a_secret_is_stored_nowhere_sqlite(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    leak, boom, shown = _run_secret_flows(fr)
    _assert_hidden(fr, leak, boom, shown)
    for file in tmp_path.glob("flowrun.db*"):  # the raw file, its WAL too
        assert SECRET.encode() not in file.read_bytes(), file


@pytest.mark.postgres
def test_a_secret_is_stored_nowhere_postgres(tmp_path: Path, pg_url: str) -> None:
    fr = Flowrun(tmp_path)
    fr.db = pg_url
    leak, boom, shown = _run_secret_flows(fr)
    _assert_hidden(fr, leak, boom, shown)
    libpq = pg_url.replace("postgresql+psycopg://", "postgresql://")
    dump = subprocess.run(["pg_dump", libpq], capture_output=True, timeout=120, check=True)
    assert b"cannot log in with ***" in dump.stdout or b"the key: ***" in dump.stdout
    assert SECRET.encode() not in dump.stdout


MISSING_FLOW = """\
initial: work
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  work:
    exec: [python, -c, "pass"]
    secrets: {API_KEY: {file: missing.key}}
    next: done
  done: {terminal: true}
"""


def test_a_missing_secret_file_is_an_error_naming_it_and_check_warns(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    path = write_flow(fr.flows, "missing", MISSING_FLOW)
    checked = fr("check")
    assert checked.returncode == 0, checked.stderr
    warning = f"{path}:9:"
    assert warning in checked.stderr and "secret API_KEY" in checked.stderr, checked.stderr
    assert "missing.key: no such file" in checked.stderr
    iid = int(fr("start", "missing").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    assert "secret API_KEY" in res.stderr and "missing.key: no such file" in res.stderr
    shown = fr.show(iid)
    assert shown["status"] == "failed"
    assert "secret API_KEY: cannot read" in json.dumps(shown)
    assert str(fr.flows / "missing.key") in json.dumps(shown)


WORKDIR_FLOW = """\
initial: here
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  here:
    exec: [sh, -c, 'pwd > here.txt']
    working_dir: {path: "out/{data.region}", create: true}
    next: there
  there:
    exec: [sh, -c, 'pwd > there.txt']
    working_dir: "missing/{data.region}"
    next: done
  done: {terminal: true}
"""


def test_working_dir_is_rendered_created_or_named_when_missing(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "wd", WORKDIR_FLOW)
    iid = int(fr("start", "wd", "region=eu").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    folder = fr.flows / "out" / "eu"
    assert (folder / "here.txt").read_text().strip() == str(folder)
    shown = fr.show(iid)
    assert shown["status"] == "failed" and shown["state"] == "there"
    missing = fr.flows / "missing" / "eu"
    assert f"working_dir {missing}: no such folder" in shown["last_error"]


def test_process_keys_only_where_they_apply(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    path = write_flow(
        fr.flows,
        "wrong",
        """\
initial: a
states:
  a: {call: "os:getcwd", next: b, working_dir: /tmp}
  b: {terminal: true, env: {X: "1"}}
""",
    )
    res = fr("check")
    assert res.returncode == 2
    lines = res.stderr.splitlines()
    assert any(
        line.startswith(f"{path}:5:") and "working_dir applies to exec handlers only" in line
        for line in lines
    ), res.stderr
    assert any(line.startswith(f"{path}:6:") and "env needs a handler" in line for line in lines)
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_secret_is_not_on_the_console(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    leak, boom, shown = _run_secret_flows(fr)
    session = f"flowrun-h9-{uuid.uuid4().hex[:8]}"
    console = shlex.join(fr.argv("tui", "--attach"))
    tmux = ["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "40"]
    env = [f"-e{k}={v}" for k, v in fr.env.items() if k in ("PYTHONPATH",)]
    subprocess.run([*tmux, "-c", str(tmp_path), *env, console], check=True)
    try:

        def screen() -> str:
            out = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session],
                check=True,
                capture_output=True,
                text=True,
            )
            return out.stdout

        poll(lambda: "leaky" in screen() and "calls" in screen(), what="first paint")
        table = screen()
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)  # detail
        detail = poll(lambda: "***" in screen() and screen(), what="the redacted error")
        for text in (table, detail):
            assert SECRET not in text
            assert SECRET[:8] not in text and SECRET[-8:] not in text
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
