"""One attempt: run a state's ``exec`` or ``call`` handler under its timeout and keepalive.

The executor knows nothing of the database: checkpoints go through a callback the worker
supplies, and the worker turns the returned :class:`AttemptResult` into an outcome.

- ``exec``: an argv list run without a shell, each argument rendered on its own from
  ``{data.x}``/``{event.x}`` key paths; a new session (process group) so a cancel or a
  timeout terminates the handler and its children (SIGTERM, then SIGKILL after
  ``kill_grace`` seconds). The control channel is described in ``runner.control``.
  Exit 0 → ``goto`` target or ``next``; 75 (``EX_TEMPFAIL``) → not yet; other → error
  with the tail of stderr.
- ``call``: ``module:function``, sync (run in a thread) or async (a task on the loop),
  given a :class:`Context`. Returns a state name (move), ``True`` (take ``next``),
  ``None`` (not yet), or raises (error).

A missed keepalive or the ``timeout`` ends the attempt as ``timeout`` (the worker counts a
restart: majordomo's model); a cancel (pause, kill, lost lease, shutdown) as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import control
from .templating import render

EXIT_NOT_YET = 75
TAIL = 4000

#: Process group ids of ``exec`` handlers now running in this process (for an abort).
live_groups: set[int] = set()

#: ``(new_data, checkpoint) -> bool``: durably store a checkpoint; False when the lease is lost.
CheckpointFn = Callable[[dict, dict], bool]


class LeaseLost(Exception):
    """Raised inside a ``call`` handler's ``ctx.checkpoint`` when the instance was taken away."""


@dataclass
class AttemptResult:
    """What one attempt produced.

    ``outcome`` is moved, not_yet, error, timeout or cancelled; ``to_state`` the requested
    target (``moved`` only; not yet checked against the graph); ``data`` the instance data
    as the handler left it; ``checkpoint`` the last checkpoint written, if any.
    """

    outcome: str
    data: dict
    to_state: str | None = None
    error: str | None = None
    checkpoint: dict | None = None


@dataclass
class Context:
    """What a ``call`` handler receives.

    Attributes: ``data`` (the instance data, a dict the handler may change; it is committed
    with the outcome), ``instance_id``, ``flow``, ``state``, ``attempt`` (1-based).
    """

    data: dict
    instance_id: int
    flow: str
    state: str
    attempt: int
    _checkpoint: CheckpointFn | None = field(default=None, repr=False)
    _signal: Callable[[], None] = field(default=lambda: None, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    _last_checkpoint: dict | None = field(default=None, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the attempt was cancelled or timed out: a sync handler should return."""
        return self._cancelled

    def keepalive(self) -> None:
        """Reset the state's keepalive deadline."""
        self._signal()

    def checkpoint(self, values: dict) -> None:
        """Merge ``values`` into ``data`` and store it durably before returning.

        Raises ``LeaseLost`` when the instance was taken away (paused, killed, lease lost).
        """
        self.data.update(values)
        self._last_checkpoint = dict(values)
        self._signal()
        if self._checkpoint is not None and not self._checkpoint(dict(self.data), dict(values)):
            self._cancelled = True
            raise LeaseLost(f"instance {self.instance_id} was taken away")


@dataclass
class Limits:
    """Time limits of one attempt, in seconds (``None``: no limit)."""

    timeout: float | None
    keepalive: float | None
    kill_grace: float = 5.0


class _Watch:
    """Deadline bookkeeping shared by both handler kinds."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.started = time.monotonic()
        self.last_signal = self.started

    def signal(self) -> None:
        self.last_signal = time.monotonic()

    def remaining(self) -> tuple[float | None, str]:
        """Seconds until the nearest deadline and what it is."""
        now = time.monotonic()
        best: tuple[float | None, str] = (None, "")
        if self.limits.timeout is not None:
            best = (self.started + self.limits.timeout - now, f"timeout ({self.limits.timeout:g}s)")
        if self.limits.keepalive is not None:
            left = self.last_signal + self.limits.keepalive - now
            if best[0] is None or left < best[0]:
                best = (left, f"missed keepalive ({self.limits.keepalive:g}s)")
        return best


class Cancel:
    """A one-shot cancel signal for one attempt, carrying the reason (cheap: no task)."""

    __slots__ = ("reason", "_callbacks")

    def __init__(self) -> None:
        self.reason: str | None = None
        self._callbacks: list[Callable[[str], None]] = []

    def is_set(self) -> bool:
        """True once :meth:`set` was called."""
        return self.reason is not None

    def set(self, reason: str = "cancelled") -> None:
        """Cancel the attempt (idempotent; the first reason wins)."""
        if self.reason is None:
            self.reason = reason
            for cb in self._callbacks:
                cb(reason)

    def on_set(self, cb: Callable[[str], None]) -> None:
        """Call ``cb(reason)`` when cancelled (at once if already)."""
        if self.reason is not None:
            cb(self.reason)
        else:
            self._callbacks.append(cb)


async def _supervise(done: asyncio.Future, watch: _Watch, cancel: Cancel) -> tuple[str, str | None]:
    """Wait for ``done``, a cancel, or a deadline: ("done"|"cancelled"|"timeout", why).

    Built from callbacks and one future per attempt (no extra tasks), since it runs for
    every attempt of every instance.
    """
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()
    timer: list[asyncio.TimerHandle] = []

    def stop(how: str, why: str | None) -> None:
        if not waiter.done():
            waiter.set_result((how, why))

    def arm() -> None:
        left, why = watch.remaining()
        if left is None:
            return
        if left <= 0:
            stop("timeout", why)
        else:
            timer[:] = [loop.call_later(left, arm)]

    if done.done():
        return "done", None
    done.add_done_callback(lambda _: stop("done", None))
    cancel.on_set(lambda reason: stop("cancelled", reason))
    arm()
    try:
        return await waiter
    finally:
        for t in timer:
            t.cancel()


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
    watch = _Watch(limits)
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
    state: dict[str, Any] = {"goto": None, "checkpoint": None, "lost": False, "bad": None}

    async def on_line(line: str) -> None:
        try:
            kind, value = control.parse(line)
        except ValueError as exc:
            state["bad"] = str(exc)
            return
        watch.signal()
        if kind == "goto":
            state["goto"] = value
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
        how, why = await _supervise(exited, watch, cancel)
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


async def run_call(
    func: Callable[..., Any],
    ctx: Context,
    *,
    limits: Limits,
    cancel: Cancel,
    threads: Executor | None,
    next_state: str | None,
) -> AttemptResult:
    """Run a ``call`` handler (sync in ``threads``, async on the loop)."""
    watch = _Watch(limits)
    ctx._signal = watch.signal
    if _is_async(func):
        return await _run_coroutine(func, ctx, watch, cancel, next_state)
    task = asyncio.get_running_loop().run_in_executor(threads, func, ctx)
    how, why = await _supervise(task, watch, cancel)
    if how != "done":
        ctx._cancelled = True
        task.cancel()  # the thread cannot be stopped: ctx.cancelled tells the handler
        outcome = "timeout" if how == "timeout" else "cancelled"
        return AttemptResult(outcome, ctx.data, error=why, checkpoint=ctx._last_checkpoint)
    try:
        value = task.result()
    except Exception as exc:  # noqa: BLE001 - a handler error is data, not a crash
        return _raised(exc, ctx)
    return _returned(value, ctx, next_state)


async def _run_coroutine(
    func: Callable[..., Any], ctx: Context, watch: _Watch, cancel: Cancel, next_state: str | None
) -> AttemptResult:
    """Await an async handler inside the attempt's own task (no extra task per attempt);
    a deadline or a cancel cancels this task and is reported as timeout / cancelled."""
    me = asyncio.current_task()
    verdict: list[tuple[str, str | None]] = []

    def stop(how: str, why: str | None) -> None:
        if not verdict and me is not None and not me.done():
            verdict.append((how, why))
            ctx._cancelled = True
            me.cancel()

    cancel.on_set(lambda reason: stop("cancelled", reason))
    deadlines = _Deadlines.of(asyncio.get_running_loop())
    deadlines.add(watch, stop)
    try:
        value = await func(ctx)
    except asyncio.CancelledError:
        if not verdict:
            raise  # the worker itself is being torn down
        how, why = verdict[0]
        outcome = "timeout" if how == "timeout" else "cancelled"
        return AttemptResult(outcome, ctx.data, error=why, checkpoint=ctx._last_checkpoint)
    except Exception as exc:  # noqa: BLE001 - a handler error is data, not a crash
        return _raised(exc, ctx)
    finally:
        verdict.append(("done", None))  # a late cancel must not hit the finished task
        deadlines.remove(watch)
    return _returned(value, ctx, next_state)


class _Deadlines:
    """One periodic check of every running async attempt's deadlines, per event loop.

    Cheaper than a timer per attempt (these run thousands of times a second); a timeout
    or missed keepalive is noticed within ``TICK`` seconds.
    """

    TICK = 0.05
    _per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: dict[_Watch, Callable[[str, str | None], None]] = {}
        self.handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Deadlines:
        """The sweeper of ``loop`` (created on first use)."""
        found = cls._per_loop.get(loop)
        if found is None:
            found = cls._per_loop[loop] = cls(loop)
        return found

    def add(self, watch: _Watch, stop: Callable[[str, str | None], None]) -> None:
        """Watch ``watch``'s deadlines; ``stop("timeout", why)`` when one passes."""
        if watch.limits.timeout is None and watch.limits.keepalive is None:
            return
        self.items[watch] = stop
        if self.handle is None:
            self.handle = self.loop.call_later(self.TICK, self._tick)

    def remove(self, watch: _Watch) -> None:
        """Stop watching (the attempt ended)."""
        self.items.pop(watch, None)

    def _tick(self) -> None:
        self.handle = None
        for watch, stop in list(self.items.items()):
            left, why = watch.remaining()
            if left is not None and left <= 0:
                self.items.pop(watch, None)
                stop("timeout", why)
        if self.items:
            self.handle = self.loop.call_later(self.TICK, self._tick)


_async_cache: dict[Callable[..., Any], bool] = {}


def _is_async(func: Callable[..., Any]) -> bool:
    """``inspect.iscoroutinefunction``, remembered per handler (it runs per attempt)."""
    known = _async_cache.get(func)
    if known is None:
        known = _async_cache[func] = inspect.iscoroutinefunction(func)
    return known


def _raised(exc: BaseException, ctx: Context) -> AttemptResult:
    if isinstance(exc, LeaseLost):
        return AttemptResult("cancelled", ctx.data, error=str(exc), checkpoint=ctx._last_checkpoint)
    return AttemptResult("error", ctx.data, error=_describe(exc), checkpoint=ctx._last_checkpoint)


def _returned(value: Any, ctx: Context, next_state: str | None) -> AttemptResult:
    """Interpret a handler's return value (see the module docstring)."""
    if value is None:
        return AttemptResult("not_yet", ctx.data, checkpoint=ctx._last_checkpoint)
    if value is True:
        value = next_state
    if isinstance(value, str) and value:
        return AttemptResult("moved", ctx.data, to_state=value, checkpoint=ctx._last_checkpoint)
    msg = f"handler returned {value!r}: expected a state name, True (take `next`) or None (not yet)"
    return AttemptResult("error", ctx.data, error=msg, checkpoint=ctx._last_checkpoint)


def _describe(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


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
    root = str(Path(__file__).resolve().parent.parent)  # so `python -m runner.control` works
    extra.append(root)
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    return env
