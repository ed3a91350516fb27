"""One attempt (``runner.handlers``): real subprocesses, real threads and coroutines.

``exec`` handlers are real programs (``sh``, the test interpreter) started without a
shell; process-group kills are checked through ``/proc``. ``call`` handlers are plain
functions of this module. No time is asserted: limits are short, waits are generous.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from runner import control_channel
from runner.control import Context
from runner.handlers.attempt import TAIL, AttemptResult, Cancel, Limits
from runner.handlers.call_handler import run_call
from runner.handlers.environ import handler_env
from runner.handlers.exec_handler import render_argv, run_exec
from tests.support.fault import group_alive, pid_alive, poll

PY = sys.executable
NO_LIMITS = Limits(timeout=60, keepalive=None, kill_grace=2.0)
#: an ``exec`` test run on both spawn paths (the C extension and Python: ``spawn_path``)
BOTH_PATHS = pytest.mark.usefixtures("spawn_path")


class Checkpoints:
    """A checkpoint callback that records what it was given (``ok`` False: lease lost)."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[dict, dict]] = []

    def __call__(self, data: dict, values: dict) -> bool:
        self.calls.append((data, values))
        return self.ok


async def run(
    argv: list[str],
    cwd: Path,
    *,
    data: dict | None = None,
    limits: Limits = NO_LIMITS,
    cancel: Cancel | None = None,
    checkpoint: Checkpoints | None = None,
    next_state: str | None = "next",
) -> AttemptResult:
    """Run ``argv`` as an ``exec`` handler the way the worker does."""
    data = data or {}
    return await run_exec(
        argv,
        cwd=cwd,
        env=handler_env("f", "s", 7, 1, cwd),
        data=data,
        limits=limits,
        cancel=cancel or Cancel(),
        checkpoint=checkpoint or Checkpoints(),
        next_state=next_state,
    )


# -- exec: argv, exit codes --------------------------------------------------------------

HOSTILE = ["$(touch pwned)", "; touch pwned2; rm -rf .", "`touch pwned3`", "a b|c>out", "*"]


@BOTH_PATHS
async def test_argv_never_goes_through_a_shell(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("x")
    script = "import json, sys; open('args.json', 'w').write(json.dumps(sys.argv[1:]))"
    argv = render_argv(("python", "-c", script, *HOSTILE, "{data.name}"), {"name": "$(id)"}, None)
    res = await run(argv, tmp_path)
    assert res.outcome == "moved", res.error
    assert json.loads((tmp_path / "args.json").read_text()) == [*HOSTILE, "$(id)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["args.json", "keep"]


@BOTH_PATHS
async def test_exit_codes(tmp_path: Path) -> None:
    ok = await run(["python", "-c", "pass"], tmp_path)
    assert (ok.outcome, ok.to_state, ok.error) == ("moved", "next", None)
    no_next = await run(["python", "-c", "pass"], tmp_path, next_state=None)
    assert no_next.outcome == "error" and "no `next`" in no_next.error
    not_yet = await run(["python", "-c", "raise SystemExit(75)"], tmp_path)
    assert (not_yet.outcome, not_yet.error) == ("not_yet", None)
    err = await run(
        ["python", "-c", "import sys; sys.stderr.write('bad input on line 3\\n'); sys.exit(3)"],
        tmp_path,
    )
    assert err.outcome == "error"
    assert err.error == "exit code 3: bad input on line 3"


@BOTH_PATHS
async def test_stderr_tail_is_the_end_of_a_long_stderr(tmp_path: Path) -> None:
    script = "import sys; sys.stderr.write('x' * 20000 + 'THE END'); sys.exit(1)"
    res = await run(["python", "-c", script], tmp_path)
    assert res.outcome == "error"
    assert res.error.startswith("exit code 1: ") and res.error.endswith("THE END")
    assert len(res.error) <= TAIL + len("exit code 1: ")


@BOTH_PATHS
async def test_missing_program_is_an_error(tmp_path: Path) -> None:
    res = await run(["/no/such/program"], tmp_path)
    assert res.outcome == "error" and "cannot start '/no/such/program'" in res.error


@BOTH_PATHS
async def test_env_names_the_attempt(tmp_path: Path) -> None:
    script = (
        "import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith('FLOWRUN_')}), file=open('env.json', 'w'))"
    )
    res = await run(["python", "-c", script], tmp_path, data={"a": 1})
    assert res.outcome == "moved"
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["FLOWRUN_INSTANCE"] == "7" and env["FLOWRUN_FLOW"] == "f"
    assert env["FLOWRUN_STATE"] == "s" and env["FLOWRUN_ATTEMPT"] == "1"
    assert json.loads(env["FLOWRUN_DATA"]) == {"a": 1}
    assert env[control_channel.ENV].isdigit()


# -- exec: the control channel --------------------------------------------------------------


@BOTH_PATHS
async def test_control_lines_from_shell(tmp_path: Path) -> None:
    script = (
        'echo keepalive > "/dev/fd/$FLOWRUN_CONTROL_FD"; '
        "python -m runner.control checkpoint '{\"rows\": 10}'; "
        'echo \'checkpoint {"rows": 20, "file": "b"}\' > "/dev/fd/$FLOWRUN_CONTROL_FD"; '
        "python -m runner.control goto other"
    )
    cps = Checkpoints()
    # plain POSIX sh (dash): `>&N` only takes one digit, the /dev/fd form takes any fd
    res = await run(["sh", "-c", script], tmp_path, data={"file": "a"}, checkpoint=cps)
    assert (res.outcome, res.to_state) == ("moved", "other"), res.error
    assert res.data == {"file": "b", "rows": 20}
    assert res.checkpoint == {"rows": 20, "file": "b"}
    assert cps.calls == [
        ({"file": "a", "rows": 10}, {"rows": 10}),
        ({"file": "b", "rows": 20}, {"rows": 20, "file": "b"}),
    ]


@BOTH_PATHS
async def test_control_lines_from_bash_redirect(tmp_path: Path) -> None:
    script = 'echo "goto other" >&"$FLOWRUN_CONTROL_FD"'
    res = await run(["bash", "-c", script], tmp_path)
    assert (res.outcome, res.to_state) == ("moved", "other"), res.error


@BOTH_PATHS
async def test_control_from_python_and_keepalive_keeps_it_alive(tmp_path: Path) -> None:
    script = (
        "import time\n"
        "from runner.control import keepalive, checkpoint, goto\n"
        "for i in range(12):\n"
        "    time.sleep(0.1)\n"
        "    keepalive()\n"
        "checkpoint({'i': i})\n"
        "goto('other')\n"
    )
    limits = Limits(timeout=60, keepalive=0.6, kill_grace=1)
    res = await run(["python", "-c", script], tmp_path, limits=limits)
    assert (res.outcome, res.to_state, res.data) == ("moved", "other", {"i": 11}), res.error


@BOTH_PATHS
async def test_malformed_control_line_is_an_error(tmp_path: Path) -> None:
    res = await run(["sh", "-c", 'echo "checkpont {}" > "/dev/fd/$FLOWRUN_CONTROL_FD"'], tmp_path)
    assert res.outcome == "error"
    assert res.error.startswith("bad control line: unknown control line")
    res = await run(["sh", "-c", 'echo "checkpoint [1]" > "/dev/fd/$FLOWRUN_CONTROL_FD"'], tmp_path)
    assert res.outcome == "error" and "JSON object" in res.error


def test_control_helpers_outside_flowrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(control_channel.ENV, raising=False)
    assert control_channel.keepalive() is False
    assert control_channel.checkpoint({"a": 1}) is False
    assert control_channel.main(["keepalive"]) == 0
    assert control_channel.main(["bogus"]) == 2
    assert control_channel.main(["goto", "two words"]) == 2
    with pytest.raises(TypeError):
        control_channel.checkpoint([1])  # type: ignore[arg-type]


@BOTH_PATHS
async def test_checkpoint_refused_cancels_the_attempt(tmp_path: Path) -> None:
    script = "echo $$ > pid; python -m runner.control checkpoint '{\"a\": 1}'; sleep 1000"
    res = await run(["sh", "-c", script], tmp_path, checkpoint=Checkpoints(ok=False))
    assert res.outcome == "cancelled" and "taken away" in res.error
    assert gone(int((tmp_path / "pid").read_text()))


# -- exec: timeout, keepalive, cancel kill the whole process group ---------------------------

SPAWNER = "echo $$ > pid; sleep 1000 & echo $! > child; wait"


def gone(leader: int, child: int | None = None) -> bool:
    """Poll until the group of ``leader`` (and ``child``) is gone: a SIGKILLed process
    lingers in ``/proc`` for a moment before it is a zombie."""

    def dead() -> bool:
        return not group_alive(leader) and (child is None or not pid_alive(child))

    return poll(dead, 10, 0.02, what=f"process group {leader} still alive")


def _pids(folder: Path) -> tuple[int, int]:
    return int((folder / "pid").read_text()), int((folder / "child").read_text())


@BOTH_PATHS
async def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    res = await run(["sh", "-c", SPAWNER], tmp_path, limits=Limits(1.0, None, 2.0))
    assert res.outcome == "timeout" and res.error.startswith("timeout (1s)")
    leader, child = _pids(tmp_path)
    assert gone(leader, child), "the handler's child survived the timeout"


@BOTH_PATHS
async def test_missed_keepalive_kills_the_process_group(tmp_path: Path) -> None:
    script = 'echo keepalive > "/dev/fd/$FLOWRUN_CONTROL_FD"; ' + SPAWNER
    res = await run(["sh", "-c", script], tmp_path, limits=Limits(60, 0.5, 2.0))
    assert res.outcome == "timeout" and res.error.startswith("missed keepalive (0.5s)")
    leader, child = _pids(tmp_path)
    assert gone(leader, child)


@BOTH_PATHS
async def test_sigterm_ignored_gets_sigkill_after_grace(tmp_path: Path) -> None:
    script = "trap '' TERM; " + SPAWNER.replace(
        "sleep 1000 &", "sh -c \"trap '' TERM; sleep 1000\" &"
    )
    res = await run(["sh", "-c", script], tmp_path, limits=Limits(0.5, None, 0.5))
    assert res.outcome == "timeout"
    leader, child = _pids(tmp_path)
    assert gone(leader, child)


@BOTH_PATHS
async def test_cancel_terminates_the_process_group(tmp_path: Path) -> None:
    cancel = Cancel()
    task = asyncio.ensure_future(run(["sh", "-c", SPAWNER], tmp_path, cancel=cancel))
    await asyncio.to_thread(poll, lambda: (tmp_path / "child").exists(), 30)
    cancel.set("paused by operator")
    res = await asyncio.wait_for(task, 30)
    assert (res.outcome, res.error) == ("cancelled", "paused by operator")
    leader, child = _pids(tmp_path)
    assert gone(leader, child)


def test_cancel_keeps_the_first_reason() -> None:
    seen: list[str] = []
    c = Cancel()
    c.on_set(seen.append)
    c.set("first")
    c.set("second")
    c.on_set(seen.append)
    assert (c.reason, seen) == ("first", ["first", "first"])


# -- call handlers ---------------------------------------------------------------------------


def ctx_for(data: dict | None = None, cps: Checkpoints | None = None) -> Context:
    """A handler context like the worker's (checkpoints go to ``cps``)."""
    return Context(
        data=dict(data or {}), instance_id=3, flow="f", state="s", attempt=2, _checkpoint=cps
    )


async def call(func, ctx: Context | None = None, **kw) -> AttemptResult:
    """Run ``func`` as a ``call`` handler with a thread pool of its own."""
    kw.setdefault("limits", NO_LIMITS)
    kw.setdefault("cancel", Cancel())
    return await run_call(func, ctx or ctx_for(), threads=None, next_state="nxt", **kw)


def ret(value):
    """A sync handler returning ``value``."""

    def handler(ctx: Context):
        ctx.data["seen"] = ctx.instance_id
        return value

    return handler


def aret(value):
    """An async handler returning ``value``."""

    async def handler(ctx: Context):
        await asyncio.sleep(0)
        ctx.data["seen"] = ctx.instance_id
        return value

    return handler


@pytest.mark.parametrize("make", [ret, aret], ids=["sync", "async"])
async def test_call_return_values(make) -> None:
    moved = await call(make("other"))
    assert (moved.outcome, moved.to_state, moved.data) == ("moved", "other", {"seen": 3})
    nxt = await call(make(True))
    assert (nxt.outcome, nxt.to_state) == ("moved", "nxt")
    assert (await call(make(None))).outcome == "not_yet"
    bad = await call(make(42))
    assert bad.outcome == "error" and "handler returned 42" in bad.error


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_call_raise_is_an_error_with_where(is_async: bool) -> None:
    def boom(ctx: Context):
        raise ValueError("no such column 'price'")

    async def aboom(ctx: Context):
        raise ValueError("no such column 'price'")

    res = await call(aboom if is_async else boom)
    assert res.outcome == "error"
    assert res.error.startswith("ValueError: no such column 'price' (at test_executor.py:")


async def test_call_checkpoint_is_durable_before_it_returns() -> None:
    cps = Checkpoints()
    order: list[str] = []

    def handler(ctx: Context):
        ctx.checkpoint({"rows": 5})
        order.append(f"after checkpoint: {len(cps.calls)} stored")
        ctx.keepalive()
        return True

    res = await call(handler, ctx_for({"f": 1}, cps))
    assert order == ["after checkpoint: 1 stored"]
    assert cps.calls == [({"f": 1, "rows": 5}, {"rows": 5})]
    assert (res.outcome, res.data, res.checkpoint) == ("moved", {"f": 1, "rows": 5}, {"rows": 5})


async def test_call_checkpoint_after_lease_lost_cancels() -> None:
    def handler(ctx: Context):
        ctx.checkpoint({"rows": 5})
        return True

    res = await call(handler, ctx_for({}, Checkpoints(ok=False)))
    assert res.outcome == "cancelled" and "taken away" in res.error


async def test_async_call_timeout_cancels_the_coroutine() -> None:
    state: dict[str, bool] = {}

    async def slow(ctx: Context):
        try:
            await asyncio.sleep(1000)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    res = await call(slow, limits=Limits(0.3, None))
    assert res.outcome == "timeout" and res.error == "timeout (0.3s)"
    await asyncio.sleep(0)
    assert state == {"cancelled": True}


async def test_async_call_missed_keepalive_and_keepalive() -> None:
    async def alive(ctx: Context):
        for _ in range(10):
            await asyncio.sleep(0.05)
            ctx.keepalive()
        return True

    async def silent(ctx: Context):
        await asyncio.sleep(1000)

    assert (await call(alive, limits=Limits(60, 0.3))).outcome == "moved"
    res = await call(silent, limits=Limits(60, 0.3))
    assert (res.outcome, res.error) == ("timeout", "missed keepalive (0.3s)")


async def test_sync_call_timeout_tells_the_handler() -> None:
    done = threading.Event()

    def slow(ctx: Context):
        while not ctx.cancelled:
            done.wait(0.01)
        done.set()

    res = await call(slow, limits=Limits(0.3, None))
    assert res.outcome == "timeout"
    assert await asyncio.to_thread(done.wait, 30), "the sync handler never saw ctx.cancelled"


async def test_call_cancel() -> None:
    cancel = Cancel()
    started = asyncio.Event()

    async def slow(ctx: Context):
        started.set()
        await asyncio.sleep(1000)

    task = asyncio.ensure_future(call(slow, cancel=cancel))
    await asyncio.wait_for(started.wait(), 30)
    cancel.set("killed by operator")
    res = await asyncio.wait_for(task, 30)
    assert (res.outcome, res.error) == ("cancelled", "killed by operator")


def test_handler_env_puts_runner_on_pythonpath(tmp_path: Path) -> None:
    env = handler_env("f", "s", 1, 1, tmp_path)
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(tmp_path)
    assert (Path(parts[1]) / "runner" / "control.py").exists()


@BOTH_PATHS
async def test_clean_exit_ends_what_the_handler_left_in_its_group(tmp_path: Path) -> None:
    """A handler that exits 0 with a background child: the child does not outlive it."""
    script = "echo $$ > pid; sleep 1000 & echo $! > child; exit 0"
    res = await run(["sh", "-c", script], tmp_path)
    assert res.outcome == "moved"
    leader, child = _pids(tmp_path)
    assert gone(leader, child), "a background child outlived its handler"
