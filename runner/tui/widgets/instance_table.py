"""The instances view: a Line-API table that only ever holds one page of rows.

``InstanceTable`` is a ``ScrollView`` whose virtual height is the number of matching
instances (plus its column header), so the scrollbar spans a million rows while the
widget renders only what is visible from the current :class:`~runner.tui.data.Page`.
When the visible window leaves the page, it posts :class:`InstanceTable.WindowChanged`
and the screen fetches the new page in a thread worker; rows not yet loaded render as
dim placeholders.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from runner.lifecycle import STATUSES
from runner.tui.guard import failure_line, log
from runner.tui.model import Page, Query, Row
from runner.tui.widgets.instance_cells import COLUMNS, LABEL_WIDTH, Column, cells, fit

#: What an empty table says (``InstanceTable.empty_hint``) when nothing matches.
NO_MATCH = "no instances match"


class InstanceTable(ScrollView, can_focus=True):
    """A virtual table of instances, fed one page at a time (see module docstring)."""

    COMPONENT_CLASSES = {
        "instance-table--header",
        "instance-table--sorted",
        "instance-table--cursor",
        "instance-table--marked",
        "instance-table--placeholder",
        "instance-table--runnable",
        "instance-table--sleeping",
        "instance-table--paused",
        "instance-table--completed",
        "instance-table--failed",
        "instance-table--killed",
        "instance-table--error",
        "instance-table--waiting",
    }

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,g", "jump(0)", "Top", show=False),
        Binding("end,G", "jump(-1)", "Bottom", show=False),
        Binding("space", "mark", "Mark", show=True),
    ]

    cursor: reactive[int] = reactive(0, always_update=True)

    class WindowChanged(Message):
        """The visible rows are no longer all in the current page."""

    class Selected(Message):
        """``enter`` on a row: open its detail."""

        def __init__(self, instance_id: int) -> None:
            super().__init__()
            self.instance_id = instance_id

    class MarksChanged(Message):
        """The set of marked rows changed."""

    class SortRequested(Message):
        """A click on a sortable column header."""

        def __init__(self, sort: str) -> None:
            super().__init__()
            self.sort = sort

    def __init__(
        self, *, clock: Callable[[], float], name: str | None = None, id: str | None = None
    ) -> None:
        super().__init__(name=name, id=id)
        self.clock = clock
        self.query_state = Query()
        self.page: Page | None = None
        self.total = 0
        self.marked: set[int] = set()
        #: Shown dimmed in the first row while nothing matches ("" shows nothing).
        self.empty_hint = ""
        self._base: Style | None = None  # ``rich_style``, until the styles change
        self._row_failures: dict[int, str] = {}  # row id -> the failure logged for it

    # -- data in -------------------------------------------------------------------

    def query_spec(self) -> Query:
        """The filters and order the table shows."""
        return self.query_state

    def set_query(self, query: Query) -> None:
        """Show ``query`` from the top; the caller fetches the first page."""
        self.query_state = query
        self.page = None
        self.cursor = 0
        self.scroll_to(y=0, animate=False)
        self.refresh()

    def window(self) -> tuple[int, int]:
        """``(offset, limit)`` of the rows to fetch: the visible ones plus a margin."""
        height = max(1, self.size.height - 1)
        top = int(self.scroll_y)
        margin = height // 2
        return max(0, top - margin), height + 2 * margin + 1

    def covers_window(self) -> bool:
        """True when the current page holds every visible row."""
        if self.page is None or self.page.query != self.query_state:
            return False
        top = int(self.scroll_y)
        bottom = min(self.total, top + max(1, self.size.height - 1))
        if bottom <= top:
            return True
        end = self.page.offset + len(self.page.rows)
        return self.page.offset <= top and (bottom <= end or self.page.exhausted)

    def set_page(self, page: Page) -> None:
        """Install a freshly read page (ignored if it is for another query)."""
        if page.query != self.query_state:
            return
        self.page = page
        if page.exhausted and page.offset <= self.total:
            self.total = page.offset + len(page.rows)
        else:
            self.total = max(self.total, page.offset + len(page.rows))
        self._resize()
        self.refresh()

    def set_total(self, total: int) -> None:
        """Set the number of rows matching the query (from the counts)."""
        if total != self.total:
            self.total = total
            self._resize()
            self.refresh()

    def _resize(self) -> None:
        self.virtual_size = Size(self.size.width, self.total + 1)
        if self.cursor >= self.total and self.total:
            self.cursor = self.total - 1

    # -- selection -----------------------------------------------------------------

    @property
    def cursor_row(self) -> Row | None:
        """The row under the cursor when it is loaded."""
        return self.page.get(self.cursor) if self.page else None

    def selected_ids(self) -> list[int]:
        """The marked ids, or the id under the cursor when nothing is marked."""
        if self.marked:
            return sorted(self.marked)
        row = self.cursor_row
        return [row.id] if row else []

    # -- actions -------------------------------------------------------------------

    def watch_cursor(self, value: int) -> None:
        height = max(1, self.size.height - 1)
        if value < self.scroll_y:
            self.scroll_to(y=value, animate=False)
        elif value >= self.scroll_y + height:
            self.scroll_to(y=value - height + 1, animate=False)
        self.refresh()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if not self.covers_window():
            self.post_message(self.WindowChanged())

    def action_cursor(self, delta: int) -> None:
        """Move the cursor by ``delta`` rows."""
        if self.total:
            self.cursor = max(0, min(self.total - 1, self.cursor + delta))

    def action_page(self, direction: int) -> None:
        """Move the cursor by one screen."""
        self.action_cursor(direction * max(1, self.size.height - 2))

    def action_jump(self, where: int) -> None:
        """To the first (0) or last (-1) row."""
        self.cursor = 0 if where == 0 else max(0, self.total - 1)

    def action_mark(self) -> None:
        """Mark or unmark the row under the cursor, then move down."""
        row = self.cursor_row
        if row is None:
            return
        self.marked.symmetric_difference_update({row.id})
        self.post_message(self.MarksChanged())
        self.action_cursor(1)
        self.refresh()

    def on_key(self, event: events.Key) -> None:
        if event.key == "enter" and (row := self.cursor_row) is not None:
            event.stop()
            self.post_message(self.Selected(row.id))

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            x = 0
            for col, width in self._layout(self.size.width):
                if x <= event.x < x + width + 1 and col.sort:
                    self.post_message(self.SortRequested(col.sort))
                    return
                x += width + 1
            return
        index = int(self.scroll_y) + event.y - 1
        if 0 <= index < self.total:
            self.cursor = index
            if event.chain == 2 and (row := self.cursor_row) is not None:
                self.post_message(self.Selected(row.id))

    # -- rendering -----------------------------------------------------------------

    @staticmethod
    @lru_cache(maxsize=8)
    def _layout(width: int) -> list[tuple[Column, int]]:
        """Each shown column with its width: fixed columns as declared; LABEL takes a third
        of what is left, at most :data:`LABEL_WIDTH` (dropped below 8 cells), LAST ERROR
        the rest (at least 10)."""
        fixed = sum(c.width + 1 for c in COLUMNS if c.width)
        rest = max(10, width - fixed)
        label = min(LABEL_WIDTH, rest // 3)
        out = []
        for c in COLUMNS:
            if c.key == "label":
                if label >= 8:
                    out.append((c, label))
                    rest -= label + 1
            else:
                out.append((c, c.width or rest))
        return out

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"instance-table--{name}", partial=True)

    def notify_style_update(self) -> None:
        self._base = None  # what Textual clears its own style caches on
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        """Line ``y`` of the widget: the header at 0, then rows from ``scroll_y``.

        ``rich_style`` (which walks every ancestor's styles: a third of a frame's
        rendering, read for each line) is kept until the styles change."""
        width = self.size.width
        if self._base is None:
            self._base = self.rich_style
        base = self._base
        if y == 0:
            return self._header(width, base)
        index = int(self.scroll_y) + y - 1
        if index >= self.total:
            if index == 0 and self.total == 0 and self.empty_hint:
                dim = base + Style(dim=True)
                hint = Segment("  " + self.empty_hint, dim)
                return Strip([hint]).adjust_cell_length(width, base)
            return Strip.blank(width, base)
        row = self.page.get(index) if self.page else None
        if row is None:
            dim = base + self._style("placeholder")
            return Strip([Segment(" " * 8 + "…", dim)]).adjust_cell_length(width, base)
        try:
            return self._row_line(row, index, width, base)
        except Exception as exc:  # a row that cannot be shown: one line in its place
            return self._failed_row(row, exc, width, base)

    def _row_line(self, row: Row, index: int, width: int, base: Style) -> Strip:
        """The line of ``row`` (at ``index`` among the matching rows)."""
        text = cells(row, self.clock(), row.id in self.marked)
        line_style = base
        if row.id in self.marked:
            line_style += self._style("marked")
        if index == self.cursor:
            line_style += self._style("cursor")
            if not self.has_focus:
                line_style += Style(dim=True)
        segments = []
        waiting = text["due"] == "on event"
        layout = self._layout(width)
        # each value is fit to exactly its column's cells, a space between two: the
        # strip's length is known (not measured again), most often ``width`` itself
        length = sum(w for _c, w in layout) + len(layout) - 1
        for i, (col, w) in enumerate(layout):
            value = fit(text[col.key], w, col.right)
            style = line_style
            if col.key == "status" and row.status in STATUSES:
                style += self._style(row.status)
            elif col.key == "error" and value.strip():
                style += self._style("waiting" if waiting else "error")
            segments.append(Segment(value if i == len(layout) - 1 else value + " ", style))
        return Strip(segments, length).adjust_cell_length(width, line_style)

    def _failed_row(self, row: Row, error: Exception, width: int, base: Style) -> Strip:
        """The one line shown in place of ``row`` when showing it raised ``error``: its
        id and the error's line (``runner.tui.guard``); the details are logged once per
        row and line. The table, the screen and the console go on."""
        line = failure_line(error)
        if self._row_failures.get(row.id) != line:
            self._row_failures[row.id] = line
            log.error("console instances row %s: %s", row.id, line, exc_info=error)
        shown = f"{row.id:>8} ⚠ cannot show this instance: {line}  (details in the console log)"
        return Strip([Segment(fit(shown, width), base + self._style("error"))])

    def _header(self, width: int, base: Style) -> Strip:
        q = self.query_state
        head = base + self._style("header")
        segments = []
        for col, w in self._layout(width):
            title = col.title
            style = head
            if col.sort and col.sort == q.sort:
                title += "↓" if q.desc else "↑"
                style = head + self._style("sorted")
            title = title[:w].rjust(w) if col.right else title[:w].ljust(w)
            segments.append(Segment(title + " ", style))
        return Strip(segments).adjust_cell_length(width, head)
