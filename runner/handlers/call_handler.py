"""``call`` handlers: ``module:function``, sync (in a thread) or async (on the loop).

The handler gets a ``Context`` and returns a state name (move), ``True`` (take ``next``),
``None`` (not yet), a ``Sleep`` (``return ctx.sleep_until(when)``: sleep in this state
until then; ``None`` after ``ctx.sleep_until`` too), or raises (error). Async handlers
are awaited inside the attempt's own task, their deadlines checked by one sweeper per
loop; a sync handler cannot be stopped from outside, so a cancel sets ``ctx.cancelled``
for it to notice.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from runner.handlers import capture
from runner.handlers.attempt import (
    AttemptResult,
    Cancel,
    Context,
    LeaseLost,
    Limits,
    Sleep,
    Watch,
    slept,
    supervise,
)


def run_call(
    func: Callable[..., Any],
    ctx: Context,
    *,
    limits: Limits,
    cancel: Cancel,
    threads: Executor | None,
    next_state: str | None,
) -> Awaitable[AttemptResult]:
    """Run a ``call`` handler (sync in ``threads``, async on the loop): await the result.

    A plain function returning the coroutine to await (one coroutine less per attempt).
    With ``ctx._attempt_log`` set, what the handler prints and logs goes to that log
    (``runner.handlers.capture``), which is ended with the attempt.
    """
    if ctx._attempt_log is not None:
        return _logged(
            func, ctx, limits=limits, cancel=cancel, threads=threads, next_state=next_state
        )
    if _is_async(func):
        if limits.timeout is None and limits.keepalive is None:
            return _run_coroutine(func, ctx, None, cancel, next_state)  # no deadline to watch
        watch = Watch(limits)
        ctx._signal = watch.signal
        return _run_coroutine(func, ctx, watch, cancel, next_state)
    watch = Watch(limits)
    ctx._signal = watch.signal
    return _run_sync(func, ctx, watch, cancel, threads, next_state)


async def _logged(
    func: Callable[..., Any],
    ctx: Context,
    *,
    limits: Limits,
    cancel: Cancel,
    threads: Executor | None,
    next_state: str | None,
) -> AttemptResult:
    """:func:`run_call` with the handler's output routed to ``ctx._attempt_log``."""
    log, ctx._attempt_log = ctx._attempt_log, None
    capture.install()
    sink = capture.Sink(log)  # type: ignore[arg-type]
    token = capture.current.set(sink)
    try:
        if _is_async(func):
            return await run_call(
                func, ctx, limits=limits, cancel=cancel, threads=threads, next_state=next_state
            )
        watch = Watch(limits)
        ctx._signal = watch.signal
        routed = capture.in_context(sink, func)
        return await _run_sync(routed, ctx, watch, cancel, threads, next_state)
    finally:
        capture.current.reset(token)
        sink.end()


async def _run_sync(
    func: Callable[..., Any],
    ctx: Context,
    watch: Watch,
    cancel: Cancel,
    threads: Executor | None,
    next_state: str | None,
) -> AttemptResult:
    """Run a sync handler in ``threads``; a deadline or cancel only sets ``ctx.cancelled``
    (a thread cannot be stopped from outside)."""
    task = asyncio.get_running_loop().run_in_executor(threads, func, ctx)
    how, why = await supervise(task, watch, cancel)
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
    func: Callable[..., Any],
    ctx: Context,
    watch: Watch | None,
    cancel: Cancel,
    next_state: str | None,
) -> AttemptResult:
    """Await an async handler inside the attempt's own task (no extra task per attempt);
    a deadline (``watch``; ``None``: the state has no timeout or keepalive) or a cancel
    cancels this task and is reported as timeout / cancelled."""
    me = asyncio.current_task()
    verdict: list[tuple[str, str | None]] = []

    def stop(how: str, why: str | None) -> None:
        if not verdict and me is not None and not me.done():
            verdict.append((how, why))
            ctx._cancelled = True
            me.cancel()

    cancel.on_set(lambda reason: stop("cancelled", reason))
    deadlines = None
    if watch is not None:
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
        if deadlines is not None and watch is not None:
            deadlines.remove(watch)
    return _returned(value, ctx, next_state)


class _Deadlines:
    """One periodic check of every running async attempt's deadlines, per event loop.

    Cheaper than a timer per attempt (these run thousands of times a second); a timeout
    or missed keepalive is noticed within ``TICK`` seconds.
    """

    TICK = 0.05
    _per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop_ref = weakref.ref(loop)  # weak: the sweeper must not keep its loop alive
        self.items: dict[Watch, Callable[[str, str | None], None]] = {}
        self.handle: asyncio.TimerHandle | None = None

    _last: _Deadlines | None = None  # the sweeper asked for last (one loop per worker)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _Deadlines:
        """The sweeper of ``loop`` (created on first use)."""
        last = cls._last
        if last is not None and last.loop_ref() is loop:
            return last
        found = cls._per_loop.get(loop)
        if found is None:
            found = cls._per_loop[loop] = cls(loop)
        cls._last = found
        return found

    def add(self, watch: Watch, stop: Callable[[str, str | None], None]) -> None:
        """Watch ``watch``'s deadlines; ``stop("timeout", why)`` when one passes."""
        self.items[watch] = stop
        loop = self.loop_ref()
        if self.handle is None and loop is not None:
            self.handle = loop.call_later(self.TICK, self._tick)

    def remove(self, watch: Watch) -> None:
        """Stop watching (the attempt ended)."""
        self.items.pop(watch, None)

    def _tick(self) -> None:
        self.handle = None
        for watch, stop in list(self.items.items()):
            left, why = watch.remaining()
            if left is not None and left <= 0:
                self.items.pop(watch, None)
                stop("timeout", why)
        loop = self.loop_ref()
        if self.items and loop is not None:
            self.handle = loop.call_later(self.TICK, self._tick)


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
    sleep = value if isinstance(value, Sleep) else ctx._sleep if value is None else None
    if sleep is not None:
        return slept(sleep, ctx.data, ctx._last_checkpoint)
    if value is None:
        return AttemptResult("not_yet", ctx.data, checkpoint=ctx._last_checkpoint)
    if value is True:
        value = next_state
    if isinstance(value, str) and value:
        return AttemptResult("moved", ctx.data, to_state=value, checkpoint=ctx._last_checkpoint)
    msg = f"handler returned {value!r}: expected a state name, True (take `next`) or None (not yet)"
    return AttemptResult("error", ctx.data, error=msg, checkpoint=ctx._last_checkpoint)


def _describe(exc: BaseException) -> str:
    """``"Type: message (at file.py:line)"``, the line being where it was raised.

    Walks the traceback to its last entry by hand: ``traceback.extract_tb`` also reads
    every source line from disk, which cost more than the rest of a failing attempt.
    """
    tb = exc.__traceback__
    where = ""
    if tb is not None:
        while tb.tb_next is not None:
            tb = tb.tb_next
        path = tb.tb_frame.f_code.co_filename
        name = _basenames.get(path)
        if name is None:
            name = _basenames[path] = os.path.basename(path)
        where = f" (at {name}:{tb.tb_lineno})"
    return f"{type(exc).__name__}: {exc}{where}"


_basenames: dict[str, str] = {}  # source path -> file name, for _describe
