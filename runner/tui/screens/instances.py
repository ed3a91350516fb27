"""The main screen: status header, the virtual instances table, the text filter input.

Reads run in thread workers: the page (visible window) on every tick, the counts on a
slower adaptive cadence (they scan an index: ~60 ms at 1M rows on SQLite), never on the
UI loop. Results are installed with ``call_from_thread``.
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import Footer, Input

from runner.lifecycle import STATUSES
from runner.tui.guard import FailureLine, GuardedScreen, background, deliver
from runner.tui.model import SORTS, Counts, Page, Query
from runner.tui.screens.dialogs import ChoiceScreen
from runner.tui.widgets.instance_table import InstanceTable
from runner.tui.widgets.status_header import StatusHeader


class InstancesScreen(GuardedScreen):
    """Instances, refreshed live; every command a key (see ``?``)."""

    BINDINGS = [
        Binding("p", "command('toggle')", "Pause/Resume"),
        Binding("k", "command('kill')", "Kill"),
        Binding("r", "command('retry')", "Retry"),
        Binding("s", "command('send')", "Send"),
        Binding("enter", "detail", "Detail", show=False),
        Binding("e", "explain", "Explain", show=False),
        Binding("l", "log", "Log", show=False),
        Binding("z", "sleep", "Sleep", show=False),
        Binding("w", "command('wake')", "Wake", show=False),
        Binding("slash", "text_filter", "Filter"),
        Binding("f", "status_filter", "Status"),
        Binding("F", "flow_filter", "Flow", show=False),
        Binding("o", "sort(1)", "Sort"),
        Binding("O", "reverse", "Reverse", show=False),
        Binding("escape", "clear", "Clear", show=False),
    ]

    #: Seconds of typing pause before the text filter applies (each key restarts it).
    FILTER_DEBOUNCE = 0.25

    def __init__(self) -> None:
        super().__init__()
        self._counts_due = 0.0
        self._counts_every = 0.0
        self._counting = False
        self._text_before = ""  # the text filter when the input opened (escape restores it)
        self._text_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        app = self.app
        mode = "read-only" if app.readonly else ""
        yield StatusHeader(mode=mode, id="status-header")
        yield FailureLine()
        yield InstanceTable(clock=app.clock, id="instances")
        yield Input(
            placeholder="filter: applies as you type; enter keeps it, escape cancels",
            id="text-filter",
        )
        yield Footer()

    @property
    def table(self) -> InstanceTable:
        """The instances table."""
        return self.query_one(InstanceTable)

    @property
    def header(self) -> StatusHeader:
        """The status header."""
        return self.query_one(StatusHeader)

    def on_mount(self) -> None:
        self.query_one("#text-filter", Input).display = False
        self.table.focus()
        self.refresh_data(counts=True)
        if self.app.refresh_interval > 0:
            self.set_interval(self.app.refresh_interval, self.refresh_data)

    def on_screen_resume(self) -> None:
        self.refresh_data(counts=True)

    # -- live data -----------------------------------------------------------------

    def refresh_data(self, counts: bool = False) -> None:
        """Fetch the visible page (and the counts when due) in thread workers."""
        if not self.is_attached:
            return
        table = self.table
        offset, limit = table.window()
        self._load_page(table.query_spec(), offset, limit, table.total, table.page)
        now = time.monotonic()
        if (counts or now >= self._counts_due) and not self._counting:
            self._counting = True
            self._load_counts(table.query_spec())

    @background("page", exclusive=True)
    def _load_page(
        self, query: Query, offset: int, limit: int, total: int, anchor: Page | None
    ) -> None:
        data = self.app.data
        page = data.page(query, offset, limit, total=total or None, anchor=anchor)
        spark = data.throughput(data.clock())
        deliver(self.app, self._show_page, page, spark)

    def _show_page(self, page: Page, spark: list[int]) -> None:
        self.table.set_page(page)
        self.header.set_spark(spark)
        if not self.table.covers_window():
            self.refresh_data()

    @background("counts")
    def _load_counts(self, query: Query) -> None:
        try:
            counts = self.app.data.counts(query)
            hint = self.app.data.empty_hint(query) if not counts.total else ""
        finally:
            self._counting = False
        self.app.call_from_thread(self._show_counts, query, counts, hint)

    def _show_counts(self, query: Query, counts: Counts, hint: str = "") -> None:
        # Counts cost a scan of an index: keep them under ~10% of the time.
        self._counts_every = max(self.app.refresh_interval, 10 * counts.elapsed)
        self._counts_due = time.monotonic() + self._counts_every
        if query != self.table.query_spec():
            return
        if hint != self.table.empty_hint:
            self.table.empty_hint = hint
            self.table.refresh()
        self.table.set_total(counts.total)
        self.header.set_counts(counts.by_status, counts.total)

    def on_instance_table_window_changed(self, _msg: InstanceTable.WindowChanged) -> None:
        self.refresh_data()

    def on_instance_table_selected(self, msg: InstanceTable.Selected) -> None:
        self.app.open_detail(msg.instance_id)

    def on_instance_table_sort_requested(self, msg: InstanceTable.SortRequested) -> None:
        q = self.table.query_spec()
        self.set_query(q.with_(sort=msg.sort, desc=not q.desc if q.sort == msg.sort else False))

    def set_query(self, query: Query) -> None:
        """Show ``query`` (filters/order) from the top and fetch it now."""
        self.table.set_query(query)
        self.header.set_query(query, len(self.table.marked))
        self.refresh_data(counts=True)

    # -- actions -------------------------------------------------------------------

    def action_command(self, command: str) -> None:
        """Run ``command`` on the marked rows, or on the row under the cursor."""
        self.app.request_command(command, self.table.selected_ids())

    def action_sleep(self) -> None:
        """Put the marked rows, or the row under the cursor, to sleep (asks how long)."""
        from runner.tui.screens.sleep import request_sleep

        request_sleep(self.app, self.table.selected_ids())

    def action_explain(self) -> None:
        """Explain the row under the cursor (``runner.tui.screens.explain``)."""
        from runner.tui.screens.explain import ExplainScreen

        row = self.table.cursor_row
        if row is not None:
            self.app.push_screen(ExplainScreen(row.id))

    def action_log(self) -> None:
        """The output of the row's latest attempt, followed (``runner.tui.screens.logs``)."""
        from runner.tui.screens.logs import LogScreen

        row = self.table.cursor_row
        if row is not None:
            self.app.push_screen(LogScreen(row.id))

    def action_detail(self) -> None:
        """Open the detail of the row under the cursor."""
        row = self.table.cursor_row
        if row is not None:
            self.app.open_detail(row.id)

    def action_text_filter(self) -> None:
        """Show the text filter input; the filter follows what is typed (debounced)."""
        box = self.query_one("#text-filter", Input)
        self._text_before = self.table.query_spec().text
        box.value = self._text_before
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "text-filter" or not event.input.display:
            return
        self._stop_text_timer()
        self._text_timer = self.set_timer(
            self.FILTER_DEBOUNCE, lambda: self._apply_text(event.value)
        )

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_text_filter()
        self._apply_text(event.value)

    def on_key(self, event) -> None:
        box = self.query_one("#text-filter", Input)
        if event.key == "escape" and box.has_focus:
            event.stop()
            self._close_text_filter()
            self._apply_text(self._text_before)

    def _apply_text(self, text: str) -> None:
        """Filter by ``text`` (stripped), unless that is already the filter."""
        q = self.table.query_spec()
        if text.strip() != q.text:
            self.set_query(q.with_(text=text.strip()))

    def _close_text_filter(self) -> None:
        self._stop_text_timer()
        self.query_one("#text-filter", Input).display = False
        self.table.focus()

    def _stop_text_timer(self) -> None:
        if self._text_timer is not None:
            self._text_timer.stop()
            self._text_timer = None

    def action_status_filter(self) -> None:
        """Choose a status to filter by (``all`` clears it)."""

        def chosen(value: str | None) -> None:
            if value is not None:
                status = None if value == "all" else value
                self.set_query(self.table.query_spec().with_(status=status))

        self.app.push_screen(ChoiceScreen("Filter by status", ["all", *STATUSES]), chosen)

    @background("flows")
    def action_flow_filter(self) -> None:
        """Choose a flow to filter by (``all`` clears it)."""
        names = self.app.data.flow_names()

        def chosen(value: str | None) -> None:
            if value is not None:
                flow = None if value == "all" else value
                self.set_query(self.table.query_spec().with_(flow=flow))

        self.app.call_from_thread(
            self.app.push_screen, ChoiceScreen("Filter by flow", ["all", *names]), chosen
        )

    def action_sort(self, step: int) -> None:
        """Sort by the next column."""
        q = self.table.query_spec()
        i = SORTS.index(q.sort) if q.sort in SORTS else 0
        self.set_query(q.with_(sort=SORTS[(i + step) % len(SORTS)], desc=False))

    def action_reverse(self) -> None:
        """Reverse the order."""
        q = self.table.query_spec()
        self.set_query(q.with_(desc=not q.desc))

    def action_clear(self) -> None:
        """Clear the filters; when there are none, clear the marks."""
        q = self.table.query_spec()
        if q.status or q.flow or q.text:
            self.set_query(q.with_(status=None, flow=None, text=""))
        elif self.table.marked:
            self.table.marked.clear()
            self.table.refresh()
            self.header.set_query(q, 0)

    def on_instance_table_marks_changed(self, _msg: InstanceTable.MarksChanged) -> None:
        self.header.set_query(self.table.query_spec(), len(self.table.marked))

    def on_descendant_focus(self) -> None:
        self.header.set_query(self.table.query_spec(), len(self.table.marked))
