"""The instances table's cells: its columns, the text of each cell of a row (stored text
made visible, ``runner.tui.literal``), and a cell fitted to its width in terminal cells
(``runner.tui.widgets.instance_table`` draws them)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size

from runner.error_line import error_line
from runner.tui import fmt, literal
from runner.tui.model import Row


@dataclass(frozen=True)
class Column:
    """One column of the table: header, width (0: takes the rest) and sort key."""

    key: str
    title: str
    width: int
    sort: str | None = None
    right: bool = False


COLUMNS = (
    Column("mark", "", 1),
    Column("id", "ID", 9, "id", right=True),
    Column("flow", "FLOW", 16, "flow"),
    Column("label", "LABEL", 0),
    Column("state", "STATE", 14, "state"),
    Column("status", "STATUS", 9, "status"),
    Column("lock", "LOCK", 14),
    Column("attempts", "ATT", 4, "attempts", right=True),
    Column("restarts", "RST", 4, "restarts", right=True),
    Column("budget", "BUDGET", 7, "errors", right=True),
    Column("due", "DUE IN", 8, "due", right=True),
    Column("error", "LAST ERROR / WAITS FOR", 0),
)


#: Widest the LABEL column gets, in cells.
LABEL_WIDTH = 24

#: Longest text of one cell, in characters (the widest terminal shows less).
CELL_LIMIT = 400


def _pool_wait(row: Row) -> str | None:
    """The pool an instance waits for a slot of (not due meanwhile), else ``None``."""
    if row.waiting_for and row.due_at is None and row.status in ("runnable", "sleeping"):
        return row.waiting_for
    return None


def cells(row: Row, now: float, marked: bool) -> dict[str, str]:
    """The text of each column for one row at time ``now``; stored text made visible
    (``runner.tui.literal``). An instance in an external state with nothing due says,
    in the last column, which events it waits for (its last error follows)."""
    used = fmt.budget_used(row.state_errors, now, row.window)
    waits = fmt.waits_for(row.status, row.due_at, row.waits_for)
    error = literal.visible(error_line(row.last_error), CELL_LIMIT)
    if waits:
        error = f"waits for {literal.visible(waits, CELL_LIMIT)}" + (f" · {error}" if error else "")
    pool = _pool_wait(row)
    if pool:
        error = f"waits for pool {literal.visible(pool, CELL_LIMIT)}" + (
            f" · {error}" if error else ""
        )
    return {
        "mark": "●" if marked else " ",
        "id": str(row.id),
        "flow": literal.visible(row.flow, CELL_LIMIT),
        "label": literal.visible(row.label, CELL_LIMIT),
        "state": literal.visible(row.state, CELL_LIMIT),
        "status": literal.visible(row.status, CELL_LIMIT),
        "lock": literal.visible(fmt.lock(row.locked_by, row.locked_until, now), CELL_LIMIT),
        "attempts": str(row.attempts),
        "restarts": str(row.restarts),
        "budget": fmt.budget(used, row.max_errors),
        "due": "on event" if waits else "pool" if pool else fmt.due_in(row.due_at, now, row.status),
        "error": error,
    }


def fit(value: str, width: int, right: bool = False) -> str:
    """``value`` padded or cut to exactly ``width`` terminal cells (wide characters
    count two), aligned right when ``right``."""
    if value.isascii():  # one cell per character: the common case, cheaper
        return value[:width].rjust(width) if right else value[:width].ljust(width)
    if right and cell_len(value) < width:
        return " " * (width - cell_len(value)) + value
    return set_cell_size(value, width)
