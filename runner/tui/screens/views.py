"""The bounded side views: workers, sensors/events/commands, flows and versions.

Their tables are small (workers, the newest 200 events, sensors, flow versions), so they
use ``DataTable``; each refreshes in a thread worker while it is shown.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from runner.tui import fmt
from runner.tui.model import FlowsInfo


class TableView(Screen):
    """A screen of titled ``DataTable`` sections refreshed by :meth:`load` in a thread."""

    #: (table id, title, column labels)
    TABLES: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    TITLE_TEXT = ""
    REFRESH = 1.0

    def compose(self) -> ComposeResult:
        yield Static(Text(f" {self.TITLE_TEXT} ", style="bold reverse"), classes="view-title")
        with Vertical(classes="view-body"):
            yield from self.extra_widgets()
            for table_id, _title, _cols in self.TABLES:
                yield DataTable(id=table_id, cursor_type="row", zebra_stripes=True)
        yield Footer()

    def extra_widgets(self) -> ComposeResult:
        """Widgets above the tables (none by default)."""
        yield from ()

    def on_mount(self) -> None:
        for table_id, title, cols in self.TABLES:
            table = self.query_one(f"#{table_id}", DataTable)
            table.border_title = title
            table.add_columns(*cols)
        self.refresh_data()
        if self.app.refresh_interval > 0:
            self.set_interval(max(self.REFRESH, self.app.refresh_interval), self.refresh_data)

    def on_screen_resume(self) -> None:
        self.refresh_data()

    def refresh_data(self) -> None:
        """Reload in a thread worker."""
        self._reload()

    @work(thread=True, exclusive=True, group="view")
    def _reload(self) -> None:
        result = self.load()
        self.app.call_from_thread(self._apply, result)

    def _apply(self, result: Any) -> None:
        if self.is_attached:
            self.show(result, self.app.clock())

    def load(self) -> Any:
        """Read the view's data (runs in a thread)."""
        raise NotImplementedError

    def show(self, result: Any, now: float) -> None:
        """Fill the tables from ``result`` (runs on the UI loop)."""
        raise NotImplementedError

    def fill(self, table_id: str, rows: list[tuple[Any, ...]]) -> None:
        """Replace the rows of one table, keeping the cursor row."""
        table = self.query_one(f"#{table_id}", DataTable)
        cursor = table.cursor_row
        table.clear()
        for row in rows:
            table.add_row(*row)
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))


class WorkersScreen(TableView):
    """Workers: id, host, pid, heartbeat age, attempts running."""

    TITLE_TEXT = "workers"
    TABLES = (
        (
            "workers",
            "workers",
            ("id", "host", "pid", "heartbeat", "running", "holding", "up for", "state"),
        ),
    )

    def load(self) -> list[dict[str, Any]]:
        return self.app.data.workers()

    def show(self, result: list[dict[str, Any]], now: float) -> None:
        rows = []
        for w in result:
            age = now - w["heartbeat_at"]
            if w["stopped_at"]:
                state = Text("stopped", style="dim")
            elif age > 30:
                state = Text("silent", style="bold red")
            else:
                state = Text("alive", style="green")
            rows.append(
                (
                    w["id"],
                    w["host"],
                    str(w["pid"]),
                    fmt.span(age) + " ago",
                    str(w["running"]),
                    str(w["holding"]),
                    fmt.span((w["stopped_at"] or now) - w["started_at"]),
                    state,
                )
            )
        self.fill("workers", rows)


class EventsScreen(TableView):
    """Sensor leases and cursors, the newest events with the rules' actions, commands."""

    TITLE_TEXT = "sensors, events and commands"
    TABLES = (
        ("sensors", "sensors", ("sensor", "lease", "left", "cursor", "updated")),
        ("events", "events (newest first)", ("id", "sensor", "key", "at", "handled", "action")),
        (
            "commands",
            "commands (newest first)",
            ("id", "instance", "command", "source", "at", "status", "result"),
        ),
    )

    def load(self) -> tuple[list, list, list]:
        data = self.app.data
        return data.sensors(), data.events(), data.commands_log()

    def show(self, result: tuple[list, list, list], now: float) -> None:
        sens, evs, cmds = result
        self.fill(
            "sensors",
            [
                (
                    s["name"],
                    s["locked_by"] or "",
                    fmt.span(s["locked_until"] - now) if s["locked_until"] else "",
                    json.dumps(s["cursor"], sort_keys=True)[:60],
                    fmt.span(now - s["updated_at"]) + " ago" if s["updated_at"] else "",
                )
                for s in sens
            ],
        )
        self.fill(
            "events",
            [
                (
                    str(e["id"]),
                    e["sensor"],
                    fmt.one_line(e["key"], 50),
                    fmt.span(now - e["created_at"]) + " ago",
                    Text("yes", style="green") if e["handled_at"] else Text("pending", "yellow"),
                    fmt.one_line(e["action"], 80),
                )
                for e in evs
            ],
        )
        self.fill(
            "commands",
            [
                (
                    str(c["id"]),
                    str(c["instance_id"]),
                    c["command"] + (f" {c['args'].get('event')}" if c["args"].get("event") else ""),
                    c["source"],
                    fmt.span(now - c["created_at"]) + " ago",
                    Text(c["status"], style="green" if c["status"] == "applied" else "red"),
                    fmt.one_line(c["result"], 80),
                )
                for c in cmds
            ],
        )


class FlowsScreen(TableView):
    """Flows loaded from the flows folder, their validation errors, stored versions."""

    TITLE_TEXT = "flows"
    REFRESH = 5.0
    BINDINGS = [
        Binding("ctrl+r", "reload", "Reload"),
        Binding("m", "migrate", "Migrate to loaded", show=False),
    ]
    TABLES = (
        ("flows", "loaded flows", ("flow", "version", "states", "sensors", "rules", "file")),
        ("versions", "stored versions", ("flow", "version", "loaded", "instances", "file")),
    )

    def extra_widgets(self) -> ComposeResult:
        yield Static("", id="flow-errors")

    def load(self) -> FlowsInfo:
        return self.app.data.flows()

    def action_reload(self) -> None:
        """Load the flows folder again."""
        self.refresh_data()

    def action_migrate(self) -> None:
        """Migrate the unfinished instances of the loaded flow under the cursor to the
        version loaded now (asks first; ``runner.ops.migrate``)."""
        from runner.tui.screens.dialogs import ConfirmScreen

        app = self.app
        if app.readonly:
            app.notify("read-only console: migrate refused", severity="warning")
            return
        table = self.query_one("#flows", DataTable)
        if table.row_count == 0:
            app.notify("no loaded flow", severity="warning")
            return
        name, version = (str(c) for c in table.get_row_at(table.cursor_row)[:2])

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._migrate(name)

        question = f"Migrate unfinished {name} instances to version {version}?"
        app.push_screen(ConfirmScreen(question, yes="Migrate"), confirmed)

    @work(thread=True, group="commands")
    def _migrate(self, name: str) -> None:
        app = self.app
        try:
            results = app.data.migrate_to_loaded(name)
        except Exception as exc:  # never crash the console on a command
            app.call_from_thread(app.notify, f"migrate: {exc}", severity="error")
            return
        done = [r for r in results if r.ok]
        refused = [r for r in results if not r.ok]
        text = f"migrate {name}: {len(done)} migrated, {len(refused)} refused"
        if refused:
            text += f"\n{refused[0].message}"
        app.call_from_thread(app.notify, text, severity="warning" if refused else "information")
        app.call_from_thread(self.refresh_data)

    def _rel(self, path: str) -> str:
        """``path`` relative to the flows folder when inside it."""
        base = self.app.data.flows_dir
        if base is not None:
            prefix = str(base.resolve()) + "/"
            for root in (prefix, str(base) + "/"):
                if path.startswith(root):
                    return path[len(root) :]
        return path

    def show(self, result: FlowsInfo, now: float) -> None:
        errors = Text()
        if result.note:
            errors.append(result.note + "\n", style="dim")
        if result.errors:
            errors.append(f"{len(result.errors)} validation error(s):\n", style="bold red")
            for e in result.errors:
                errors.append(f"  {self._rel(e)}\n", style="red")
        elif self.app.data.flows_dir is not None and not result.note:
            errors.append("all flows valid\n", style="green")
        self.query_one("#flow-errors", Static).update(errors)
        self.fill(
            "flows",
            [
                (
                    f["name"],
                    f["version"],
                    str(f["states"]),
                    str(f["sensors"]),
                    str(f["rules"]),
                    self._rel(f["path"]),
                )
                for f in result.loaded
            ],
        )
        self.fill(
            "versions",
            [
                (
                    v["flow"],
                    v["version"],
                    fmt.span(now - v["loaded_at"]) + " ago",
                    _per_status(v.get("instances") or {}),
                    self._rel(v["path"]),
                )
                for v in result.versions
            ],
        )


def _per_status(counts: dict[str, int]) -> str:
    """``"3: runnable 2, completed 1"`` (statuses in lifecycle order), or ``"0"``."""
    from runner.lifecycle import STATUSES

    if not counts:
        return "0"
    parts = [f"{s} {counts[s]}" for s in STATUSES if counts.get(s)]
    return f"{sum(counts.values())}: {', '.join(parts)}"
