"""A state's ``limits`` are set in its handler's process before its program starts, on
both spawn paths (the C extension and Python's ``_posixsubprocess``); an attempt ended by
one is an error that says which. Real daemon, real handlers, real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fault import Flowrun, write_flow

LIMITS_FLOW = """\
initial: measure
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  measure:
    exec: [sh, -c, 'echo "$(ulimit -v) $(ulimit -n) $(nice) $(ulimit -p)" > limits.txt']
    limits: {memory: 256MiB, files: 100, nice: 7, processes: 64}
    next: hog
  hog:
    exec: [python, -c, "x = bytearray(1 << 30)"]
    limits: {memory: 256MiB}
    next: done
  done: {terminal: true}
"""

SPIN_FLOW = """\
initial: spin
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  spin:
    exec: [python, -c, "while True: pass"]
    limits: {cpu: 1s}
    next: done
  done: {terminal: true}
"""


def _flowrun(tmp_path: Path, path: str) -> Flowrun:
    fr = Flowrun(tmp_path)
    if path == "python":
        fr.env["FLOWRUN_SPAWN"] = "python"
    return fr


@pytest.mark.parametrize("path", ["c", "python"])
def test_limits_are_set_and_a_memory_hog_is_ended_by_its_limit(tmp_path: Path, path: str) -> None:
    fr = _flowrun(tmp_path, path)
    write_flow(fr.flows, "lim", LIMITS_FLOW)
    iid = int(fr("start", "lim").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    assert (fr.flows / "limits.txt").read_text().split() == [str(256 * 1024), "100", "7", "64"]
    shown = fr.show(iid)
    assert shown["status"] == "failed" and shown["state"] == "hog"
    error = shown["history"][-1]["error"]
    assert error.startswith("memory limit 256 MiB reached (exit code 1)"), error
    assert "MemoryError" in error
    fr.env["COLUMNS"] = "200"
    line = fr("ls").stdout
    assert "memory limit 256 MiB reached" in line


@pytest.mark.parametrize("path", ["c", "python"])
def test_a_cpu_limit_ends_a_spinning_handler(tmp_path: Path, path: str) -> None:
    fr = _flowrun(tmp_path, path)
    write_flow(fr.flows, "spin", SPIN_FLOW)
    iid = int(fr("start", "spin").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=180)
    assert res.returncode == 0, res.stderr
    shown = fr.show(iid)
    assert shown["status"] == "failed"
    assert shown["history"][-1]["error"].startswith("cpu limit 1 s reached (killed by signal")
    assert json.dumps(shown).count("cpu limit 1 s reached") >= 1


def test_limits_on_a_call_state_are_refused_by_check(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    path = write_flow(
        fr.flows,
        "callim",
        """\
initial: a
states:
  a: {call: "os:getcwd", next: b, limits: {memory: 1GiB}}
  b: {terminal: true}
""",
    )
    res = fr("check")
    assert res.returncode == 2
    assert f"{path}:5:" in res.stderr and "limits applies to exec handlers only" in res.stderr
    bad = write_flow(
        fr.flows, "callim", "initial: a\nstates:\n  a: {exec: [x], limits: {memory: lots}}\n"
    )
    res = fr("check", str(bad))
    assert res.returncode == 2 and "not a size: 'lots'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


USER_FLOW = """\
initial: drop
defaults:
  error_budget: {max_errors: 1, on_exhausted: failed}
states:
  drop:
    exec:
      - sh
      - -c
      - 'id -u > uid.txt; id -g > gid.txt; id -G > groups.txt;
        wc -c < "$FLOWRUN_DATA_FILE" > size.txt'
    working_dir: "{data.dir}"
    user: nobody
    next: done
  done: {terminal: true}
"""


@pytest.mark.parametrize("path", ["c", "python"])
def test_user_drops_a_handler_to_nobody(tmp_path: Path, path: str) -> None:
    import pwd
    import tempfile

    nobody = pwd.getpwnam("nobody")
    fr = _flowrun(tmp_path, path)
    write_flow(fr.flows, "drop", USER_FLOW)
    shared = Path(tempfile.mkdtemp(prefix="flowrun-user-"))
    shared.chmod(0o777)
    big = "x" * 100_000  # over 64 kB: the data travels in a file the handler must read
    iid = int(fr("start", "drop", f"dir={shared}", f"big={big}").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    assert fr.show(iid)["status"] == "completed", fr.show(iid)["last_error"]
    assert (shared / "uid.txt").read_text().strip() == str(nobody.pw_uid)
    assert (shared / "gid.txt").read_text().strip() == str(nobody.pw_gid)
    assert (shared / "groups.txt").read_text().split() == [str(nobody.pw_gid)]
    assert int((shared / "size.txt").read_text()) > 100_000
    assert (shared / "uid.txt").stat().st_uid == nobody.pw_uid


@pytest.mark.parametrize("path", ["c", "python"])
def test_group_overrides_the_users_own_group(tmp_path: Path, path: str) -> None:
    import grp
    import pwd
    import tempfile

    daemon = grp.getgrnam("daemon")
    fr = _flowrun(tmp_path, path)
    write_flow(
        fr.flows, "drop", USER_FLOW.replace("user: nobody", "user: nobody\n    group: daemon")
    )
    shared = Path(tempfile.mkdtemp(prefix="flowrun-group-"))
    shared.chmod(0o777)
    big = "x" * 100_000  # the flow reads its data file (over 64 kB of data)
    iid = int(fr("start", "drop", f"dir={shared}", f"big={big}").stdout)
    res = fr("--daemon", "--exit-when-idle", timeout=120)
    assert res.returncode == 0, res.stderr
    assert fr.show(iid)["status"] == "completed", fr.show(iid)["last_error"]
    assert (shared / "uid.txt").read_text().strip() == str(pwd.getpwnam("nobody").pw_uid)
    assert (shared / "gid.txt").read_text().strip() == str(daemon.gr_gid)
    assert (shared / "groups.txt").read_text().split() == [str(daemon.gr_gid)]


def test_an_unknown_user_is_refused_when_the_daemon_loads_the_flow(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    path = write_flow(fr.flows, "ghost", USER_FLOW.replace("user: nobody", "user: no_such_user_h9"))
    res = fr("--daemon", "--exit-when-idle", timeout=60)
    assert res.returncode != 0
    assert f"{path}:14:" in res.stderr and "user 'no_such_user_h9': no such user" in res.stderr
    assert "Traceback" not in res.stderr
