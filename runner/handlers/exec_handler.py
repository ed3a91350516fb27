"""``exec`` handlers: an argv run without a shell, in its own process group.

Each argument is rendered on its own from ``{data.x}``/``{event.x}`` key paths. The handler
gets ``FLOWRUN_*`` variables and a control channel (``runner.control``). Exit 0 → its
``goto`` or the state's ``next``; 75 (``EX_TEMPFAIL``) → not yet; after a ``sleep`` line,
0 or 75 → sleep in this state until then; other → error with the tail of stderr. A
cancel or a deadline terminates the whole group (SIGTERM, then SIGKILL after the grace);
on a clean exit, whatever the handler left in its group is ended too, and descendants
that left the group are ended by ``runner.handlers.reaper``.

Per attempt the cost outside the process itself is one spawn on a spawn thread
(``runner.handlers.spawn``), its exit from its pidfd in an epoll set the loop reads
(``runner.handlers.exits``), and one ``poll`` of its pipes at the exit; no asyncio
transport, stream or task, and no pipe watched unless it runs longer than
``supervised.READ_AFTER`` (stdout and stderr in the exit set, the control channel a
selector registration; with an attempt log, stdout and stderr are watched from the start,
which keeps the order of the two streams). The running handler's pipes and exit are
``runner.handlers.supervised``'s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

from runner.control_channel import EXIT_NOT_YET
from runner.handlers.attempt import (
    AttemptResult,
    Cancel,
    CheckpointFn,
    Limits,
    Sleep,
    Watch,
    slept,
    supervise,
)
from runner.handlers.process_setup import ProcSetup, limit_reached
from runner.handlers.spawn import spawn
from runner.handlers.supervised import Supervised
from runner.log_buffer import AttemptLog
from runner.templating import render


def interpreter(arg0: str) -> str:
    """``python``/``python3`` as argv[0] means the interpreter running flowrun."""
    return sys.executable if arg0 in ("python", "python3") else arg0


def render_argv(
    argv: tuple[str, ...], data: dict[str, Any], event: dict[str, Any] | None
) -> list[str]:
    """Render each argument on its own; never joined, never given to a shell."""
    context = {"data": data, "event": event or {}}
    return [render(a, context) for a in argv]


async def run_exec(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    data: dict[str, Any],
    limits: Limits,
    cancel: Cancel,
    checkpoint: CheckpointFn,
    next_state: str | None,
    secrets: tuple[bytes, ...] = (),
    setup: ProcSetup | None = None,
    limits_given: tuple[tuple[str, float], ...] = (),
    log: AttemptLog | None = None,
) -> AttemptResult:
    """Run an ``exec`` handler; see the module docstring for the exit-code contract.

    ``env`` (from :func:`handler_env`) is completed with the data, control and reaper
    variables (``runner.handlers.spawn``) and changed in place. Every secret value in
    ``secrets`` the handler writes (stdout, stderr, control lines) is kept as ``***``.
    ``setup`` is applied in the child before its ``exec``; an error caused by one of
    ``limits_given`` (the state's ``limits``) says which. With a ``log``, everything the
    handler writes on stdout and stderr goes to it as it is read (secrets redacted), and
    it is ended when the attempt is.
    """
    data = dict(data)
    watch = Watch(limits)
    try:
        child = await spawn([interpreter(argv[0]), *argv[1:]], str(cwd), env, data, setup)
    except (OSError, subprocess.SubprocessError) as exc:
        return AttemptResult(
            "error",
            data,
            error=f"cannot start {argv[0]!r}: {getattr(exc, 'strerror', None) or exc}",
        )
    io = Supervised(child, data, watch, cancel, checkpoint, secrets, log)
    try:
        how, why = await supervise(io.exited, watch, cancel)
        grace = limits.kill_grace if cancel.grace is None else min(cancel.grace, limits.kill_grace)
        await _end_group(io, grace, leader_done=how == "done")
        io.drain()
        await io.checkpoints_stored()
    finally:
        io.close()
        if log is not None:
            log.end()
    stderr, stdout = io.tail(child.err), io.tail(child.out)
    last = io.last_checkpoint
    if how == "timeout":
        return AttemptResult("timeout", data, error=_with_tail(why, stderr), checkpoint=last)
    if how == "cancelled":
        return AttemptResult("cancelled", data, error=cancel.reason or why, checkpoint=last)
    code = cast(int, child.proc.returncode)  # the process has exited
    if io.sleep is not None and code in (0, EXIT_NOT_YET) and not io.bad:
        return slept(Sleep(io.sleep), data, last)
    if code == 0:
        target = io.goto or next_state
        if io.bad:
            return AttemptResult(
                "error", data, error=f"bad control line: {io.bad}", checkpoint=last
            )
        if target is None:
            msg = "exited 0 but the state has no `next` and the handler sent no `goto`"
            return AttemptResult("error", data, error=msg, checkpoint=last)
        return AttemptResult("moved", data, to_state=target, checkpoint=last)
    if code == EXIT_NOT_YET:
        return AttemptResult("not_yet", data, checkpoint=last)
    what = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    tail = stderr if stderr.strip() else stdout  # stdout when stderr has nothing to say
    if limits_given and (reached := limit_reached(limits_given, code, tail)):
        what = f"{reached} ({what})"
    return AttemptResult("error", data, error=_with_tail(what, tail), checkpoint=last)


def _with_tail(what: str | None, tail: str) -> str:
    tail = tail.strip()
    return f"{what}: {tail}" if tail else (what or "")


async def _end_group(io: Supervised, grace: float, *, leader_done: bool) -> None:
    """End the handler's process group.

    With ``leader_done`` the handler exited by itself: what it left in its group gets
    SIGTERM. Otherwise (timeout, cancel) the group gets SIGTERM, SIGKILL after ``grace``
    seconds if the handler is still there, and SIGKILL again once it is gone, for what
    it left. Descendants that left the group are ended by ``runner.handlers.reaper``.
    """
    pgid = io.child.proc.pid
    if leader_done:
        _killpg(pgid, signal.SIGTERM)
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        _killpg(pgid, sig)
        try:
            await asyncio.wait_for(asyncio.shield(io.exited), wait)
        except TimeoutError:
            continue
        _killpg(pgid, signal.SIGKILL)
        return


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
