"""The two header lines of the instances view: counts per status, throughput sparkline,
the active filters and order, and the console's mode (attached / read-only)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from runner.lifecycle import STATUSES
from runner.tui import fmt, literal
from runner.tui.model import Query

STATUS_STYLES = {
    "runnable": "bold green",
    "sleeping": "cyan",
    "paused": "yellow",
    "completed": "dim",
    "failed": "bold red",
    "killed": "magenta",
}


class StatusHeader(Static):
    """Counts per status (the active status filter highlighted), attempts finished per
    second over the last minute, and the filters in force."""

    def __init__(self, *, mode: str = "", id: str | None = None) -> None:
        super().__init__(id=id)
        self.mode = mode
        self.counts: dict[str, int] = {}
        self.spark: list[int] = []
        self.query_state = Query()
        self.total: int | None = None
        self.marked = 0

    def set_counts(self, counts: dict[str, int], total: int) -> None:
        """New counts per status and the number of rows matching the filters."""
        self.counts, self.total = counts, total
        self._redraw()

    def set_spark(self, spark: list[int]) -> None:
        """New throughput buckets (attempts finished per second, oldest first)."""
        self.spark = spark
        self._redraw()

    def set_query(self, query: Query, marked: int) -> None:
        """The filters/order in force and how many rows are marked."""
        self.query_state, self.marked = query, marked
        self._redraw()

    def _redraw(self) -> None:
        self.update(self.render_text())

    def render_text(self) -> Text:
        """Both header lines as rich text."""
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append(" flowrun ", style="bold reverse")
        if self.mode:
            t.append(f" {self.mode} ", style="bold black on yellow")
        t.append(" ")
        total = sum(self.counts.values())
        t.append(f"{fmt.thousands(total)} instances", style="bold")
        for status in STATUSES:
            n = self.counts.get(status, 0)
            style = STATUS_STYLES[status]
            if self.query_state.status == status:
                style += " reverse"
            t.append("  ")
            t.append(f"{status} {fmt.thousands(n)}", style=style)
        t.append("\n")
        spark = self.spark[-30:]
        rate = sum(self.spark[-10:]) / 10 if self.spark else 0.0
        t.append(" throughput ", style="dim")
        t.append(fmt.sparkline(spark), style="green")
        t.append(f" {rate:.1f}/s", style="bold")
        q = self.query_state
        t.append("   filter ", style="dim")
        parts = []
        if q.status:
            parts.append(f"status={q.status}")
        if q.flow:
            parts.append(f"flow={q.flow}")
        if q.text:
            parts.append(f"/{q.text}")
        literal.append(t, " ".join(parts) or "none", "bold cyan" if parts else "dim", limit=200)
        t.append("   sort ", style="dim")
        t.append(f"{q.sort}{' ↓' if q.desc else ' ↑'}", style="bold")
        if self.total is not None:
            t.append("   shown ", style="dim")
            t.append(fmt.thousands(self.total), style="bold")
        if self.marked:
            t.append("   marked ", style="dim")
            t.append(str(self.marked), style="bold magenta")
        return t
