"""The bounded side views: workers, sensors/events/commands, flows and versions.

Their tables are small (workers, the newest 200 events, sensors, flow versions), so they
use ``DataTable``; each refreshes in a thread worker while it is shown.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Static

from runner.tui import fmt, literal
from runner.tui.guard import FailureLine, GuardedScreen, background, deliver
from runner.tui.model import FlowsInfo


class TableView(GuardedScreen):
    """A screen of titled ``DataTable`` sections refreshed by :meth:`load` in a thread."""

    #: (table id, title, column labels)
    TABLES: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    TITLE_TEXT = ""
    REFRESH = 1.0

    def compose(self) -> ComposeResult:
        yield Static(Text(f" {self.TITLE_TEXT} ", style="bold reverse"), classes="view-title")
        yield FailureLine()
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
        # the first load comes from ``on_screen_resume``: Textual posts ScreenResume on
        # every push, the first one included
        if self.app.refresh_interval > 0:
            self.set_interval(max(self.REFRESH, self.app.refresh_interval), self.refresh_data)

    def on_screen_resume(self) -> None:
        self.refresh_data()

    def refresh_data(self) -> None:
        """Reload in a thread worker."""
        self._reload()

    @background("view", exclusive=True)
    def _reload(self) -> None:
        result = self.load()
        deliver(self.app, self._apply, result)

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


#: The style of each liveness verdict (``runner.ops.liveness``) in the workers view.
VERDICT_STYLES = {
    "alive": "green",
    "late": "bold yellow",
    "dead": "bold red",
    "stopped": "dim",
}


#: Longest "what happened" (a tail sensor's line, a path) shown in the events view.
WHAT_LIMIT = 200
#: Longest text of an event's deliveries (its rules' exec and webhook) in the events view.
DELIVERIES_LIMIT = 160


class WorkersScreen(TableView):
    """Workers: id, host, pid, heartbeat age, attempts running, liveness verdict."""

    TITLE_TEXT = "workers and pools"
    TABLES = (
        (
            "workers",
            "workers",
            ("id", "host", "pid", "heartbeat", "running", "holding", "up for", "state"),
        ),
        ("pools", "pools", ("pool", "slots", "in use", "waiting", "rate", "held by")),
    )

    def load(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.app.data.workers(), self.app.data.pools()

    def show(self, result: tuple[list[dict[str, Any]], list[dict[str, Any]]], now: float) -> None:
        workers, pools = result
        self.fill("pools", [pool_cells(p) for p in pools])
        rows = []
        for w in workers:
            age = now - w["heartbeat_at"]
            state = literal.cell(w["verdict"], VERDICT_STYLES.get(w["verdict"], ""))
            rows.append(
                (
                    literal.cell(w["id"]),
                    literal.cell(w["host"]),
                    str(w["pid"]),
                    fmt.span(age) + " ago",
                    str(w["running"]),
                    str(w["holding"]),
                    fmt.span((w["stopped_at"] or now) - w["started_at"]),
                    state,
                )
            )
        self.fill("workers", rows)


def pool_cells(pool: dict[str, Any]) -> tuple[Any, ...]:
    """One row of the pools table (``runner.ops.pools.read_pools``)."""
    slots = "-" if pool["slots"] is None else str(pool["slots"])
    if pool["set"] is not None:
        slots += " (set)"
    rate = f"{pool['rate']}: {pool['recent_starts']} now" if pool["rate"] else "-"
    return (
        literal.cell(pool["name"]),
        slots,
        str(pool["in_use"]),
        str(pool["waiting"]),
        rate,
        literal.cell(", ".join(str(i) for i in pool["holders"]) or "-"),
    )


class EventsScreen(TableView):
    """Sensor leases and cursors, the newest events with the rules' actions and their
    deliveries (exec, webhook: delivered, pending or FAILED), commands."""

    TITLE_TEXT = "sensors, events and commands"
    TABLES = (
        ("sensors", "sensors", ("sensor", "lease", "left", "cursor", "updated")),
        (
            "events",
            "events (newest first)",
            ("id", "sensor", "key", "at", "handled", "action", "deliveries", "what happened"),
        ),
        (
            "commands",
            "commands (newest first)",
            ("id", "instance", "command", "source", "at", "status", "result"),
        ),
    )

    def load(self) -> tuple[list[Any], list[Any], list[Any]]:
        data = self.app.data
        return data.sensors(), data.events(), data.commands_log()

    def show(self, result: tuple[list[Any], list[Any], list[Any]], now: float) -> None:
        sens, evs, cmds = result
        self.fill(
            "sensors",
            [
                (
                    literal.cell(s["name"]),
                    literal.cell(s["locked_by"]),
                    fmt.span(s["locked_until"] - now) if s["locked_until"] else "",
                    literal.cell(json.dumps(s["cursor"], sort_keys=True), limit=60),
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
                    literal.cell(e["sensor"]),
                    literal.cell(e["key"], limit=50),
                    fmt.span(now - e["created_at"]) + " ago",
                    Text("yes", style="green") if e["handled_at"] else Text("pending", "yellow"),
                    literal.cell(e["action"], limit=80),
                    literal.cell(
                        "; ".join(fmt.delivery_text(d) for d in e.get("deliveries") or ()),
                        limit=DELIVERIES_LIMIT,
                    ),
                    literal.cell(fmt.event_what(e["payload"]), limit=WHAT_LIMIT),
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
                    literal.cell(fmt.command_label(c)),
                    literal.cell(c["source"]),
                    fmt.span(now - c["created_at"]) + " ago",
                    literal.cell(c["status"], "green" if c["status"] == "applied" else "red"),
                    literal.cell(c["result"], limit=80),
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

    def __init__(self) -> None:
        super().__init__()
        #: The loaded flows shown (``FlowsInfo.loaded``), in table order.
        self.loaded: list[dict[str, Any]] = []

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
        if table.row_count == 0 or not self.loaded:
            app.notify("no loaded flow", severity="warning")
            return
        flow = self.loaded[min(table.cursor_row, len(self.loaded) - 1)]
        name, version = str(flow["name"]), str(flow["version"])

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._migrate(name)

        question = f"Migrate unfinished {name} instances to version {version}?"
        app.push_screen(ConfirmScreen(question, yes="Migrate"), confirmed)

    @background("commands")
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
            literal.append(errors, result.note, "dim")
            errors.append("\n")
        if result.errors:
            errors.append(f"{len(result.errors)} validation error(s):\n", style="bold red")
            for e in result.errors:
                literal.append(errors, f"  {self._rel(e)}", "red")
                errors.append("\n")
        elif self.app.data.flows_dir is not None and not result.note:
            errors.append("all flows valid\n", style="green")
        self.query_one("#flow-errors", Static).update(errors)
        self.loaded = list(result.loaded)
        self.fill(
            "flows",
            [
                (
                    literal.cell(f["name"]),
                    literal.cell(f["version"]),
                    str(f["states"]),
                    str(f["sensors"]),
                    str(f["rules"]),
                    literal.cell(self._rel(f["path"])),
                )
                for f in result.loaded
            ],
        )
        self.fill(
            "versions",
            [
                (
                    literal.cell(v["flow"]),
                    literal.cell(v["version"]),
                    fmt.span(now - v["loaded_at"]) + " ago",
                    _per_status(v.get("instances") or {}),
                    literal.cell(self._rel(v["path"])),
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
