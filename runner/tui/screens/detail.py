"""The detail of one instance: summary, error budget burning down, the flow's state graph
with the current state marked, data and checkpoints (JSON), attempts and commands."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Static

from runner.error_line import error_line
from runner.flowspec import deadlines
from runner.store.deadlines import LIVE
from runner.tui import fmt, literal
from runner.tui.guard import FailureLine, GuardedScreen, background, deliver
from runner.tui.model import Detail
from runner.tui.widgets.status_header import STATUS_STYLES

#: Longest line of data or checkpoint JSON shown, in characters.
JSON_LINE = 500


def summary_text(d: Detail, now: float) -> Text:
    """Id, flow, label, state, status, due time (or the events an instance in an external
    state waits for), lock and counters; stored text shown literally."""
    r = d.row
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" instance {r['id']} ", style="bold reverse")
    literal.append(t, f"  {r['flow']}", "bold")
    if r.get("label"):
        literal.append(t, f"  {r['label']}")
    literal.append(t, f"  version {r['version']}", "dim")
    t.append("\n state ", style="dim")
    literal.append(t, r["state"], "bold")
    t.append("  status ", style="dim")
    literal.append(t, r["status"], STATUS_STYLES.get(r["status"], ""))
    running = r["running_attempt"] is not None
    waits = fmt.waits_for(r["status"], r["due_at"], state_events(d), running=running)
    if waits:
        t.append("  waits for ", style="dim")
        literal.append(t, waits, "bold cyan")
    else:
        t.append("  due ", style="dim")
        t.append(fmt.due_in(r["due_at"], now, r["status"], running=running) or "-")
    t.append("  lock ", style="dim")
    literal.append(t, fmt.lock(r["locked_by"], r["locked_until"], now) or "-")
    countdown = deadline_text(d, now)
    if countdown:
        t.append("  deadline ", style="dim")
        literal.append(t, countdown, "bold yellow")
    t.append("\n attempts ", style="dim")
    t.append(str(r["attempts"]))
    t.append("  errors ", style="dim")
    t.append(str(r["errors"]))
    t.append("  restarts ", style="dim")
    t.append(f"{r['restarts']} (this state {r['state_restarts']})")
    t.append("  in state for ", style="dim")
    t.append(fmt.span(now - r["state_changed"]) if r["state_changed"] else "-")
    if r.get("last_error"):
        t.append("\n last error ", style="dim")
        t.append(literal.visible(error_line(r["last_error"]), 300), style="red")
    return t


def deadline_text(d: Detail, now: float) -> str:
    """The countdown to a live instance's next deadline and what it does then
    (``"1h 12m → escalate"``, ``"passed 3s ago → escalate"``), ``""`` without one."""
    r = d.row
    at = r.get("deadline_at")
    if at is None or r["status"] not in LIVE:
        return ""
    found = deadlines.describe(d.flow, r["state"], r["state_changed"], r["created_at"], at)
    then = found[1].then if d.flow is not None and found and found[1] else "?"
    left = at - now
    return f"{fmt.span(left)} → {then}" if left > 0 else f"passed {fmt.span(-left)} ago → {then}"


def state_events(d: Detail) -> list[str] | None:
    """The ``on:`` events of the instance's state when that state is external (moved by
    events only), else ``None`` (also when its flow version is unavailable)."""
    if d.flow is None:
        return None
    st = d.flow.states.get(d.row["state"])
    return list(st.on or {}) if st is not None and st.kind == "external" else None


def budget_text(d: Detail, now: float, width: int = 40) -> Text:
    """The error budget: a burn-down bar and a timeline of errors across the window."""
    r, pol = d.row, d.policy
    errs = sorted(r["state_errors"] or [])
    t = Text(no_wrap=True)
    if pol is None:
        t.append(f" {len(errs)} errors in this state", style="bold")
        literal.append(t, f"  (budget unknown: {d.flow_error or 'no policy'})", "dim")
        return t
    window, max_errors = float(pol.window), int(pol.max_errors)
    live = [e for e in errs if e >= now - window]
    used = len(live)
    left = max(0, max_errors - used)
    style = "green" if used < max_errors / 2 else "yellow" if used < max_errors else "bold red"
    t.append(" used ", style="dim")
    t.append(fmt.bar(used, max_errors, width), style=style)
    t.append(f" {used}/{max_errors}", style="bold")
    t.append(f"  left {left}", style=style)
    literal.append(t, f"  window {fmt.span(window)}  on exhausted: {pol.on_exhausted}", "dim")
    cells = ["·"] * width
    for e in live:
        i = min(width - 1, int((e - (now - window)) / window * width))
        cells[i] = "✖"
    t.append("\n errors ", style="dim")
    t.append("".join(cells), style="red")
    t.append(f"  ← {fmt.span(window)} ago … now", style="dim")
    if live:
        t.append("\n next error leaves the window in ", style="dim")
        t.append(fmt.span(live[0] + window - now))
    return t


def graph_text(d: Detail) -> Text:
    """The flow's states and edges, one state a line, the current state marked ▶."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if d.flow is None:
        literal.append(t, f" graph unavailable: {d.flow_error or 'flow not loaded'}", "dim")
        return t
    current = d.row["state"]
    width = max((len(n) for n in d.flow.states), default=8)
    for name, st in d.flow.states.items():
        mark = "▶ " if name == current else "  "
        style = "bold reverse" if name == current else ""
        t.append(mark, style="bold yellow")
        literal.append(t, name.ljust(width), style)
        t.append(f"  {st.kind:<9}", style="dim")
        edges: list[str] = []
        if st.next:
            edges.append(f"→ {st.next}")
        if st.to:
            edges.append("→ " + " | ".join(st.to))
        for ev, target in (st.on or {}).items():
            edges.append(f"{ev} ⇢ {target}")
        if st.exhausted_target is not None:
            edges.append(f"on_exhausted ⇢ {st.exhausted_target}")
        literal.append(t, "  ".join(edges))
        if name == d.flow.initial:
            t.append("  (initial)", style="dim")
        t.append("\n")
    return t


def checkpoints_text(d: Detail) -> Text:
    """Data (JSON), then every attempt's checkpoint, newest first; shown literally."""
    t = Text()
    t.append("data:\n", style="bold")
    t.append_text(literal.text(fmt.pretty_json(d.row["data"]), limit=JSON_LINE, multiline=True))
    cps = [a for a in d.attempts if a.get("checkpoint") is not None]
    if not cps:
        t.append("\n\nno checkpoints", style="dim")
    for a in cps[:20]:
        t.append(f"\n\ncheckpoint of attempt {a['attempt']} ", style="bold")
        literal.append(t, f"({a['state']}):", "bold")
        t.append("\n")
        t.append_text(
            literal.text(fmt.pretty_json(a["checkpoint"]), limit=JSON_LINE, multiline=True)
        )
    return t


class DetailScreen(GuardedScreen):
    """One instance, refreshed every second; ``p k r s`` act on it."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("p", "command('toggle')", "Pause/Resume"),
        Binding("k", "command('kill')", "Kill"),
        Binding("r", "command('retry')", "Retry"),
        Binding("s", "command('send')", "Send"),
        Binding("e", "explain", "Explain", show=False),
        Binding("l", "log", "Log", show=False),
        Binding("z", "sleep", "Sleep", show=False),
        Binding("w", "command('wake')", "Wake", show=False),
    ]

    def __init__(self, instance_id: int) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.detail: Detail | None = None

    def compose(self) -> ComposeResult:
        yield FailureLine()
        with VerticalScroll(id="detail"):
            yield Static(Text(f"loading instance {self.instance_id}…"), id="summary")
            yield Static("", id="budget", classes="section")
            with Horizontal(id="detail-columns"):
                with Vertical(id="graph-box", classes="section"):
                    yield Static("", id="graph")
                with Vertical(id="data-box", classes="section"):
                    yield Static("", id="data")
            yield DataTable(id="attempts", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="commands", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#budget").border_title = "error budget"
        self.query_one("#graph-box").border_title = "state graph"
        self.query_one("#data-box").border_title = "data and checkpoints"
        att = self.query_one("#attempts", DataTable)
        att.border_title = "attempts (newest first)"
        att.add_columns("#", "state", "worker", "started", "duration", "outcome", "to", "error")
        cmd = self.query_one("#commands", DataTable)
        cmd.border_title = "commands"
        cmd.add_columns("when", "command", "source", "status", "result")
        self.refresh_data()
        if self.app.refresh_interval > 0:
            self.set_interval(max(1.0, self.app.refresh_interval), self.refresh_data)

    def refresh_data(self) -> None:
        """Re-read the instance in a thread worker."""
        self._load()

    @background("detail", exclusive=True)
    def _load(self) -> None:
        d = self.app.data.detail(self.instance_id)
        deliver(self.app, self._show, d)

    def _show(self, d: Detail | None) -> None:
        if d is None:
            self.query_one("#summary", Static).update(Text(f"no instance {self.instance_id}"))
            return
        self.detail = d
        now = self.app.clock()
        self.query_one("#summary", Static).update(summary_text(d, now))
        self.query_one("#budget", Static).update(budget_text(d, now))
        self.query_one("#graph", Static).update(graph_text(d))
        self.query_one("#data", Static).update(checkpoints_text(d))
        att = self.query_one("#attempts", DataTable)
        att.clear()
        for a in d.attempts:
            att.add_row(*self._attempt_cells(a, now))
        cmd = self.query_one("#commands", DataTable)
        cmd.clear()
        for c in d.commands:
            cmd.add_row(
                fmt.span(now - c["created_at"]) + " ago",
                literal.cell(fmt.command_label(c)),
                literal.cell(c["source"]),
                literal.cell(c["status"]),
                literal.cell(c["result"], limit=120),
            )

    @staticmethod
    def _attempt_cells(a: dict[str, Any], now: float) -> tuple[Any, ...]:
        dur = (a["finished_at"] - a["started_at"]) if a["finished_at"] else now - a["started_at"]
        outcome = a["outcome"] or "running"
        style = {"error": "red", "timeout": "red", "lost": "yellow", "moved": "green"}.get(
            outcome, ""
        )
        return (
            str(a["attempt"]),
            literal.cell(a["state"]),
            literal.cell(a["worker"]),
            fmt.span(now - a["started_at"]) + " ago",
            fmt.span(dur),
            literal.cell(outcome, style),
            literal.cell(a["to_state"]),
            literal.cell(error_line(a["error"]), limit=120),
        )

    def action_sleep(self) -> None:
        """Put this instance to sleep (asks how long)."""
        from runner.tui.screens.sleep import request_sleep

        request_sleep(self.app, [self.instance_id])

    def action_explain(self) -> None:
        """Explain this instance (``runner.tui.screens.explain``)."""
        from runner.tui.screens.explain import ExplainScreen

        self.app.push_screen(ExplainScreen(self.instance_id))

    def action_log(self) -> None:
        """The output of the attempt under the attempts table's cursor when it has the
        focus, else of the latest attempt (``runner.tui.screens.logs``)."""
        from runner.tui.screens.logs import LogScreen

        table = self.query_one("#attempts", DataTable)
        attempt = None
        if table.has_focus and table.row_count:
            try:
                attempt = int(str(table.get_row_at(table.cursor_row)[0]))
            except (ValueError, IndexError):
                attempt = None
        self.app.push_screen(LogScreen(self.instance_id, attempt))

    def action_command(self, command: str) -> None:
        """Run ``command`` on this instance."""
        self.app.request_command(command, [self.instance_id])
