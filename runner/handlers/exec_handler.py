"""``exec`` handlers: an argv run without a shell, in its own process group.

Each argument is rendered on its own from ``{data.x}``/``{event.x}`` key paths. The handler
gets ``FLOWRUN_*`` variables and a control channel (``runner.control``). Exit 0 → its
``goto`` or the state's ``next``; 75 (``EX_TEMPFAIL``) → not yet; after a ``sleep`` line,
0 or 75 → sleep in this state until then; other → error with the tail of stderr. A
cancel or a deadline terminates the whole group (SIGTERM, then SIGKILL after the grace);
on a clean exit, whatever the handler left in its group is ended too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner import control
from runner.handlers.attempt import (
    EXIT_NOT_YET,
    TAIL,
    AttemptResult,
    Cancel,
    CheckpointFn,
    Limits,
    Sleep,
    Watch,
    slept,
    supervise,
)
from runner.templating import render

#: Process group ids of ``exec`` handlers now running in this process (for an abort).
live_groups: set[int] = set()


def interpreter(arg0: str) -> str:
    """``python``/``python3`` as argv[0] means the interpreter running flowrun."""
    return sys.executable if arg0 in ("python", "python3") else arg0


def render_argv(argv: tuple[str, ...], data: dict, event: dict | None) -> list[str]:
    """Render each argument on its own; never joined, never given to a shell."""
    context = {"data": data, "event": event or {}}
    return [render(a, context) for a in argv]


async def run_exec(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    data: dict,
    limits: Limits,
    cancel: Cancel,
    checkpoint: CheckpointFn,
    next_state: str | None,
) -> AttemptResult:
    """Run an ``exec`` handler; see the module docstring for the exit-code contract."""
    data = dict(data)
    watch = Watch(limits)
    read_fd, write_fd = os.pipe()
    env = {**env, control.ENV: str(write_fd)}
    try:
        proc = await asyncio.create_subprocess_exec(
            interpreter(argv[0]),
            *argv[1:],
            cwd=str(cwd),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(write_fd,),
        )
    except OSError as exc:
        os.close(read_fd)
        return AttemptResult(
            "error", data, error=f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        )
    finally:
        os.close(write_fd)
    state: dict[str, Any] = {
        "goto": None,
        "checkpoint": None,
        "lost": False,
        "bad": None,
        "sleep": None,
    }

    async def on_line(line: str) -> None:
        try:
            kind, value = control.parse(line)
        except ValueError as exc:
            state["bad"] = str(exc)
            return
        watch.signal()
        if kind == "goto":
            state["goto"] = value
        elif kind == "sleep":
            state["sleep"] = value
        elif kind == "checkpoint":
            data.update(value)
            state["checkpoint"] = value
            ok = await asyncio.to_thread(checkpoint, dict(data), dict(value))
            if not ok:
                state["lost"] = True
                cancel.set("instance taken away during checkpoint")

    live_groups.add(proc.pid)
    control_task = asyncio.ensure_future(_read_control(read_fd, on_line))
    out_task = asyncio.ensure_future(_tail(proc.stdout))
    err_task = asyncio.ensure_future(_tail(proc.stderr))
    exited = _leader_exited(proc)
    try:
        how, why = await supervise(exited, watch, cancel)
        if how != "done":
            await _kill_group(proc, limits.kill_grace)
        else:  # the handler is done: nothing it started in its group outlives it
            await _kill_group(proc, limits.kill_grace, leader_done=True)
    finally:
        live_groups.discard(proc.pid)
    await asyncio.wait({control_task, out_task, err_task}, timeout=2.0)
    for t in (control_task, out_task, err_task):
        t.cancel()
    stderr = err_task.result() if err_task.done() and not err_task.cancelled() else ""
    stdout = out_task.result() if out_task.done() and not out_task.cancelled() else ""
    last = state["checkpoint"]
    if how == "timeout":
        return AttemptResult("timeout", data, error=_with_tail(why, stderr), checkpoint=last)
    if how == "cancelled":
        return AttemptResult("cancelled", data, error=why, checkpoint=last)
    code = proc.returncode
    if state["sleep"] is not None and code in (0, EXIT_NOT_YET) and not state["bad"]:
        return slept(Sleep(state["sleep"]), data, last)
    if code == 0:
        target = state["goto"] or next_state
        if state["bad"]:
            return AttemptResult(
                "error", data, error=f"bad control line: {state['bad']}", checkpoint=last
            )
        if target is None:
            msg = "exited 0 but the state has no `next` and the handler sent no `goto`"
            return AttemptResult("error", data, error=msg, checkpoint=last)
        return AttemptResult("moved", data, to_state=target, checkpoint=last)
    if code == EXIT_NOT_YET:
        return AttemptResult("not_yet", data, checkpoint=last)
    what = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    return AttemptResult("error", data, error=_with_tail(what, stderr or stdout), checkpoint=last)


def _with_tail(what: str | None, tail: str) -> str:
    tail = tail.strip()
    return f"{what}: {tail}" if tail else (what or "")


async def _tail(stream: asyncio.StreamReader | None) -> str:
    if stream is None:
        return ""
    buf = b""
    while chunk := await stream.read(65536):
        buf = (buf + chunk)[-TAIL:]
    return buf.decode(errors="replace")


async def _read_control(fd: int, on_line: Callable[[str], Any]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
    )
    try:
        while line := await reader.readline():
            await on_line(line.decode(errors="replace"))
    finally:
        transport.close()


def _leader_exited(proc: asyncio.subprocess.Process) -> asyncio.Future:
    """A future done when the handler's own process exits.

    ``proc.wait()`` also waits for every copy of its stdout/stderr to close, which a
    background child it left behind may hold forever; a pidfd (Linux) watches the leader
    alone. Elsewhere, fall back to ``proc.wait()``.
    """
    loop = asyncio.get_running_loop()
    if proc.returncode is not None:
        fut = loop.create_future()
        fut.set_result(None)
        return fut
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:  # already exited and reaped
        fut = loop.create_future()
        fut.set_result(None)
        return fut
    except (AttributeError, OSError):
        return asyncio.ensure_future(proc.wait())
    fut = loop.create_future()

    def ready() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    fut.add_done_callback(lambda f: f.cancelled() and ready())
    return fut


async def _kill_group(
    proc: asyncio.subprocess.Process, grace: float, *, leader_done: bool = False
) -> None:
    """SIGTERM the handler's process group, then SIGKILL after ``grace`` seconds.

    With ``leader_done`` the handler itself has exited: only what it left in its group is
    ended, and its exit status is collected.
    """
    if leader_done:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            await asyncio.wait_for(proc.wait(), grace)
            return
        except TimeoutError:
            pass
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), wait)
            try:  # the leader exited; make sure no child of the group survives it
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except TimeoutError:
            continue


def handler_env(
    flow: str, state: str, instance_id: int, attempt: int, data: dict, cwd: Path
) -> dict:
    """The environment of an ``exec`` handler: ours plus ``FLOWRUN_*`` and ``PYTHONPATH``."""
    env = dict(os.environ)
    env.update(
        FLOWRUN_INSTANCE=str(instance_id),
        FLOWRUN_FLOW=flow,
        FLOWRUN_STATE=state,
        FLOWRUN_ATTEMPT=str(attempt),
        FLOWRUN_DATA=json.dumps(data, separators=(",", ":")),
    )
    extra = [str(cwd)]
    root = str(Path(__file__).resolve().parents[2])  # so `python -m runner.control` works
    extra.append(root)
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    return env
