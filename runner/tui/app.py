"""The operator console: a thin ``App`` wiring views, keys and the command path.

The console never imports the worker or executor. It reads through
``runner.tui.data.ConsoleData`` (its own read queries, on a read-only engine) and writes
only through ``runner.ops.commands.submit(..., source="tui")``, the CLI's command path.
``cli.py`` runs the embedded worker when not ``--attach``.

Views are Textual modes: ``1`` instances, ``2`` workers, ``3`` sensors/events/commands,
``4`` flows. ``?`` lists every key; ``ctrl+p`` opens the command palette.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from textual.app import App
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.worker import Worker, WorkerState

from runner.errors import database_failure
from runner.tui import literal
from runner.tui.data import ConsoleData
from runner.tui.guard import background, report
from runner.tui.palette import ConsoleCommands
from runner.tui.screens.detail import DetailScreen
from runner.tui.screens.dialogs import ChoiceScreen, ConfirmScreen, HelpScreen, StoppingScreen
from runner.tui.screens.instances import InstancesScreen
from runner.tui.screens.views import EventsScreen, FlowsScreen, WorkersScreen

if TYPE_CHECKING:
    from runner.ops.commands import CommandResult

VIEWS = ("instances", "workers", "events", "flows")


class FlowrunApp(App[None]):
    """The flowrun operator console.

    Args:
        engine: the runner's database engine.
        flows_dir: the flows folder, shown in the flows view (optional).
        readonly: refuse every command (with a notification).
        clock: seconds since the epoch; tests inject a fixed clock.
        refresh_interval: seconds between live refreshes (0 disables them).
        live: ``False`` is ``refresh_interval=0`` (benchmarks, snapshots).
        stopper: the embedded worker's stop handle, or ``None`` (``--attach``); see
            ``StoppingScreen``. With attempts running, ``q`` stops it gracefully and
            shows what is left; ``q`` again aborts.
    """

    TITLE = "flowrun"
    CSS_PATH = "flowrun.tcss"
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("1", "view('instances')", "Instances", show=False),
        Binding("2", "view('workers')", "Workers", show=False),
        Binding("3", "view('events')", "Events", show=False),
        Binding("4", "view('flows')", "Flows", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        engine: Engine,
        *,
        flows_dir: str | Path | None = None,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
        refresh_interval: float = 0.5,
        live: bool = True,
        stopper: Any = None,
    ) -> None:
        super().__init__()
        self.stopper = stopper
        self.engine = engine
        self.readonly = readonly
        self.clock = clock
        self.refresh_interval = refresh_interval if live else 0.0
        self.data = ConsoleData(engine, clock=clock, flows_dir=flows_dir)
        self.add_mode("instances", InstancesScreen)
        self.add_mode("workers", WorkersScreen)
        self.add_mode("events", EventsScreen)
        self.add_mode("flows", FlowsScreen)
        if readonly:
            self.sub_title = "read-only"

    def on_mount(self) -> None:
        self.switch_mode("instances")

    def on_unmount(self) -> None:
        self.data.close()

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Textual's ``notify``, but the message (which may quote stored text: a result,
        an error) is shown literally (``runner.tui.literal``; lines kept) unless a caller
        passes ``markup=True`` for text it wrote itself."""
        if not markup:
            message = literal.visible(message, 1000, multiline=True)
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A command worker of the app that failed (``runner.tui.guard``): one
        notification line, details in the log; the console goes on."""
        if event.state is WorkerState.ERROR:
            self.notify(report("app", event.worker), severity="error")

    # -- navigation ----------------------------------------------------------------

    async def action_quit(self) -> None:
        """Quit; with an embedded worker still running attempts, stop it first and say
        so (``StoppingScreen``) instead of showing a blank screen for the grace period."""
        stopper = self.stopper
        if stopper is None or stopper.stopped() or not stopper.running():
            self.exit()
            return
        if not isinstance(self.screen, StoppingScreen):
            stopper.stop()
            self.push_screen(StoppingScreen(stopper, self.clock))

    def action_view(self, name: str) -> None:
        """Switch to one of the views (``VIEWS``)."""
        if name in VIEWS and self.current_mode != name:
            self.switch_mode(name)

    def action_help(self) -> None:
        """Show every key."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def open_detail(self, instance_id: int) -> None:
        """Push the detail screen of one instance."""
        self.push_screen(DetailScreen(instance_id))

    def _instances(self) -> InstancesScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, InstancesScreen):
                return screen
        return None

    def action_selection(self, command: str) -> None:
        """Run ``command`` on the selection of the current screen (palette entry)."""
        screen = self.screen
        if isinstance(screen, DetailScreen):
            self.request_command(command, [screen.instance_id])
        elif (inst := self._instances()) is not None:
            self.request_command(command, inst.table.selected_ids())

    def action_filter_status(self, status: str) -> None:
        """Filter the instances by status (``""`` clears every filter)."""
        self.action_view("instances")
        inst = self._instances()
        if inst is not None:
            q = inst.table.query_spec()
            if status:
                inst.set_query(q.with_(status=status))
            else:
                inst.set_query(q.with_(status=None, flow=None, text=""))

    def action_sort_by(self, sort: str) -> None:
        """Sort the instances by ``sort``."""
        self.action_view("instances")
        inst = self._instances()
        if inst is not None:
            inst.set_query(inst.table.query_spec().with_(sort=sort, desc=False))

    # -- commands ------------------------------------------------------------------

    def request_command(self, command: str, ids: Sequence[int]) -> None:
        """Ask for ``command`` on ``ids``: confirm a kill, choose an event for a send,
        decide pause or resume for ``toggle``; then submit it in a thread."""
        ids = list(ids)
        label = "pause/resume" if command == "toggle" else command
        if self.readonly:
            self.notify(f"read-only console: {label} refused", severity="warning")
            return
        if not ids:
            self.notify("no instance selected", severity="warning")
            return
        if command == "kill":
            what = f"instance {ids[0]}" if len(ids) == 1 else f"{len(ids)} instances"

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self._submit(ids, "kill")

            self.push_screen(ConfirmScreen(f"Kill {what}?", yes="Kill"), confirmed)
        elif command == "send":
            self._choose_event(ids)
        elif command == "toggle":
            self._toggle(ids)
        else:
            self._submit(ids, command)

    @background("commands")
    def _toggle(self, ids: list[int]) -> None:
        statuses = self.data.statuses(ids)
        paused = bool(statuses) and all(s == "paused" for s in statuses.values())
        self._submit_now(ids, "resume" if paused else "pause")

    @background("commands")
    def _choose_event(self, ids: list[int]) -> None:
        try:
            names = self.data.allowed_events(ids)
        except Exception as exc:  # unknown id, flow version not stored, ...
            self.call_from_thread(self.notify, f"send: {exc}", severity="error")
            return
        what = f"instance {ids[0]}" if len(ids) == 1 else f"{len(ids)} instances"

        def chosen(event: str | None) -> None:
            if event:
                self._submit(ids, "send", event)

        screen = ChoiceScreen(
            f"Send an event to {what}", names, empty="its state accepts no events (escape)"
        )
        self.call_from_thread(self.push_screen, screen, chosen)

    @background("commands")
    def _submit(self, ids: list[int], command: str, event: str | None = None) -> None:
        self._submit_now(ids, command, event)

    def _submit_now(self, ids: list[int], command: str, event: str | None = None) -> None:
        try:
            results = self.data.submit(ids, command, event)
        except DBAPIError as exc:  # a full disk, a lost connection: one line
            self.call_from_thread(
                self.notify, f"{command}: {database_failure(exc)}", severity="error"
            )
            return
        except Exception as exc:  # never crash the console on a command
            self.call_from_thread(self.notify, f"{command}: {exc}", severity="error")
            return
        self.call_from_thread(self._report, command, results)

    def _report(self, command: str, results: list[CommandResult]) -> None:
        """Show the outcome of a command as one notification, then refresh."""
        ok = [r for r in results if r.ok]
        refused = [r for r in results if not r.ok]
        if len(results) == 1:
            r = results[0]
            self.notify(r.message, severity="information" if r.ok else "warning")
        else:
            text = f"{command}: {len(ok)} applied, {len(refused)} refused"
            if refused:
                text += f"\n{refused[0].message}"
            self.notify(text, severity="warning" if refused else "information")
        refresh = getattr(self.screen, "refresh_data", None)
        if callable(refresh):
            refresh()
