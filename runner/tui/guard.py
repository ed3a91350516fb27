"""Where the console catches what goes wrong in a view: at its thread workers.

Every view reads in a thread worker (:func:`background`) and installs what it read with
``call_from_thread``, so an exception anywhere in a view's load *or* in showing it ends
that worker. Textual would then exit the app (a worker's ``exit_on_error`` defaults to
true, and ``App._handle_exception`` always exits; an exception in a message handler also
ends that widget's message loop, so there is no safe place to resume there). Workers
made by :func:`background` do not exit the app: Textual posts ``Worker.StateChanged``
(``ERROR``) to the worker's node, and :class:`GuardedScreen` shows one line in place
(:class:`FailureLine`) and logs the details (``flowrun.console``: the embedded console's
log file, ``.flowrun/console.log``). The next successful load of the same group clears
the line. The console, and the embedded worker next to it, go on.

A database that cannot be read is an expected fault: one line, logged without a
traceback. Anything else is logged with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError
from textual import work
from textual.app import App
from textual.screen import Screen
from textual.widgets import Static
from textual.worker import Worker, WorkerState, get_current_worker

from runner.errors import database_failure
from runner.tui import literal

if TYPE_CHECKING:
    from textual import getters

    from runner.tui.app import FlowrunApp

log = logging.getLogger("flowrun.console")


def background(group: str, *, exclusive: bool = False) -> Any:
    """The decorator of every console thread worker: ``textual.work`` in a thread, in
    ``group`` (``exclusive``: a new call cancels the running one), that never exits the
    app on an exception (see the module docstring)."""
    return work(thread=True, group=group, exclusive=exclusive, exit_on_error=False)


def deliver(app: App[Any], show: Callable[..., Any], *args: Any) -> None:
    """From inside a :func:`background` thread worker: run ``show(*args)`` on the UI loop
    (``call_from_thread``, waiting for it) unless the worker was cancelled meanwhile.

    An ``exclusive`` worker is cancelled when a newer load of its group starts, but a
    thread cannot be stopped: its asyncio task ends at once (``wait_for_complete`` no
    longer waits for it) while the thread reads on. Its result, stale, would otherwise be
    shown whenever the thread finishes, over the newer one. Raises what ``show`` raises."""
    if not get_current_worker().is_cancelled:
        app.call_from_thread(show, *args)


def failure_line(error: BaseException) -> str:
    """One visible line for ``error``: ``database_failure`` for a database error, else
    ``Type: first line of the message``."""
    if isinstance(error, SQLAlchemyError):
        return literal.one_line(database_failure(error), 300)
    message = literal.one_line(str(error), 300)
    name = type(error).__name__
    return f"{name}: {message}" if message else name


def report(where: str, worker: Worker[Any], *, unless: str | None = None) -> str:
    """Log the failure of ``worker`` (in ``where``, e.g. a screen's name) and return its
    one line (:func:`failure_line`); a line equal to ``unless`` (the same failure again,
    on the next refresh) is not logged again. Raises nothing."""
    error = worker.error if worker.error is not None else RuntimeError("unknown failure")
    line = failure_line(error)
    if line == unless:
        return line
    if isinstance(error, SQLAlchemyError):
        log.error("console %s (%s): %s", where, worker.group, line)
    else:
        log.error("console %s (%s): %s", where, worker.group, line, exc_info=error)
    return line


class FailureLine(Static):
    """The one line a view shows in place when a load failed (hidden otherwise)."""

    DEFAULT_CSS = "FailureLine { height: auto; color: $error; display: none; }"

    def show_failure(self, line: str) -> None:
        """Show ``line`` (already visible, one line)."""
        self.update(literal.text(f"⚠ {line}  (details in the console log)", no_wrap=True))
        self.display = True

    def clear(self) -> None:
        """Hide the line."""
        if self.display:
            self.display = False
            self.update("")


class GuardedScreen(Screen[None]):
    """A screen whose thread workers' failures are shown in its :class:`FailureLine`
    (the screen yields one from ``compose``; without one, as a notification)."""

    if TYPE_CHECKING:  # the console's screens run in FlowrunApp only
        app = getters.app(FlowrunApp)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._failed: dict[str, str] = {}

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        group = event.worker.group
        if event.state is WorkerState.ERROR:
            before = self._failed.get(group)
            self._failed[group] = report(type(self).__name__, event.worker, unless=before)
        elif event.state is WorkerState.SUCCESS and group in self._failed:
            del self._failed[group]
        else:
            return
        lines = self.query(FailureLine)
        if not lines:
            if event.state is WorkerState.ERROR:
                self.app.notify(self._failed[group], severity="error", markup=False)
            return
        if self._failed:
            lines.first().show_failure(next(reversed(self._failed.values())))
        else:
            lines.first().clear()
