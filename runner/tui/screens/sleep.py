"""The console's sleep key (``z``): pick how long, then the instances sleep in their state
(``runner.ops.commands`` ``sleep``: nothing spent). ``w`` wakes them (an ordinary
command through ``FlowrunApp.request_command``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runner.durations import parse_duration
from runner.tui.screens.dialogs import ChoiceScreen

if TYPE_CHECKING:
    from runner.tui.app import FlowrunApp

#: The durations ``z`` offers.
SLEEP_CHOICES = ("15m", "1h", "4h", "1d", "7d")


def request_sleep(app: FlowrunApp, ids: Sequence[int]) -> None:
    """Ask how long ``ids`` should sleep, then submit ``sleep`` in a thread worker and
    report it as every command is (``app._report``). Refused in a read-only console."""
    ids = list(ids)
    if app.readonly:
        app.notify("read-only console: sleep refused", severity="warning")
        return
    if not ids:
        app.notify("no instance selected", severity="warning")
        return
    what = f"instance {ids[0]}" if len(ids) == 1 else f"{len(ids)} instances"

    def chosen(choice: str | None) -> None:
        if choice:
            app.run_worker(
                lambda: _submit(app, ids, choice),
                thread=True,
                group="commands",
                exit_on_error=False,
            )

    app.push_screen(ChoiceScreen(f"Sleep {what} for", list(SLEEP_CHOICES)), chosen)


def _submit(app: FlowrunApp, ids: list[int], choice: str) -> None:
    try:
        results = app.data.submit(ids, "sleep", until=app.clock() + parse_duration(choice))
    except Exception as exc:  # never crash the console on a command
        app.call_from_thread(app.notify, f"sleep: {exc}", severity="error")
        return
    app.call_from_thread(app._report, "sleep", results)
