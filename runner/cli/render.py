"""Human output of the CLI (``--json`` is the machine output): rich tables, no colour codes
when stdout is not a terminal."""

from __future__ import annotations

import functools
import json
import shutil
import time
from datetime import datetime

import click

from runner.error_line import error_line
from runner.tui import fmt


@functools.lru_cache(maxsize=1)
def _rich():
    """``(console, Table)``: rich, imported on first use (``ls`` needs none of it)."""
    from rich.console import Console
    from rich.table import Table

    return Console(highlight=False, soft_wrap=False), Table


def _ago(iso_ts: str | None, *, future: bool = False) -> str:
    if not iso_ts:
        return "-"
    ts = datetime.fromisoformat(iso_ts.replace("Z", "+00:00")).timestamp()
    delta = ts - time.time() if future else time.time() - ts
    sign = "" if delta >= 0 else "-"
    delta = abs(delta)
    if delta < 60:
        text = f"{delta:.1f}s"
    elif delta < 3600:
        text = f"{delta / 60:.1f}m"
    elif delta < 86400:
        text = f"{delta / 3600:.1f}h"
    else:
        text = f"{delta / 86400:.1f}d"
    return sign + text


def json_lines_array(items: list) -> str:
    """A JSON array with one item per line: valid JSON, readable, and written by the
    ``json`` module's C encoder (``indent`` falls back to its pure-Python encoder, which
    took 1.2 s for 10,000 instances)."""
    if not items:
        return "[]"
    return "[\n" + ",\n".join(map(json.dumps, items)) + "\n]"


#: The instance table's columns: (header, key, least width it shrinks to or ``None`` when
#: it never shrinks, rank in which it is dropped when even shrunk they do not fit, or
#: ``None`` when it always shows). ``id`` and ``status`` always show.
INSTANCE_COLUMNS: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("id", "id", None, None),
    ("flow", "flow", 8, 8),
    ("label", "label", 8, 6),
    ("state", "state", 8, 7),
    ("status", "status", None, None),
    ("att", "attempts", None, 3),
    ("err", "errors", None, 4),
    ("rst", "restarts", None, 2),
    ("due in", "due", None, 5),
    ("lock", "lock", 8, 1),
    ("last error", "last_error", 12, 0),
)
#: The order in which columns shrink (down to their least width) before any is dropped.
SHRINK_ORDER = ("last_error", "lock", "label", "flow", "state")
#: The widest a ``last error`` cell gets.
LAST_ERROR_WIDTH = 60
#: The widest a ``label`` cell gets.
LABEL_WIDTH = 30


def _cells(s: str) -> int:
    if s.isascii():
        return len(s)
    from rich.cells import cell_len

    return cell_len(s)


def _clip(s: str, width: int) -> str:
    if _cells(s) <= width:
        return s
    if s.isascii():
        return s[: width - 1] + "…"
    from rich.cells import set_cell_size

    return set_cell_size(s, width - 1) + "…"


def fit_columns(
    columns: tuple[tuple[str, str, int | None, int | None], ...],
    widths: dict[str, int],
    width: int,
    shrink_order: tuple[str, ...],
    gap: int = 2,
) -> dict[str, int]:
    """The columns (key → width) that fit in ``width`` terminal cells, in table order.

    Columns first shrink, in ``shrink_order``, down to their least width; while the table
    is still too wide, columns are dropped in their drop rank's order. Columns without a
    drop rank always stay (the table may then be wider than ``width``).

    Args:
        columns: ``INSTANCE_COLUMNS``-shaped (header, key, least width, drop rank).
        widths: each key's natural width (its widest cell or header).
        width: the terminal's width in cells.
        shrink_order: keys, the first shrinks first.
        gap: cells between two columns.
    """
    least = {key: (m if m is not None else widths[key]) for _h, key, m, _r in columns}
    droppable = [c[1] for c in sorted((c for c in columns if c[3] is not None), key=lambda c: c[3])]
    for dropped in range(len(droppable) + 1):
        gone = set(droppable[:dropped])
        out = {key: widths[key] for _h, key, _m, _r in columns if key not in gone}
        for key in shrink_order:
            excess = sum(out.values()) + gap * (len(out) - 1) - width
            if excess <= 0:
                break
            if key in out:
                out[key] -= min(excess, max(0, out[key] - least[key]))
        if sum(out.values()) + gap * (len(out) - 1) <= width:
            break
    return out


def instance_table(rows: list[dict], *, width: int | None = None) -> None:
    """Print instances (``runner.ops.queries.read_instances`` rows with ``TABLE_KEYS``,
    times in epoch seconds): id, flow, label (when any has one), state, status, attempts,
    errors, restarts, due, lock, last error, fitted to ``width`` cells (default: the
    terminal's, or ``COLUMNS``, or 80 when piped). ``id`` and ``status`` always show; the
    other columns shrink, then drop.

    Plain text built here (a rich ``Table`` took 16 s for 10,000 rows); the header is
    bold on a terminal.
    """
    if width is None:
        width = shutil.get_terminal_size((80, 24)).columns
    now = time.time()
    cells = []
    for r in rows:
        err = r.get("last_error")
        cells.append(
            {
                "id": str(r["id"]),
                "flow": r["flow"],
                "label": _clip(r.get("label") or "", LABEL_WIDTH),
                "state": r["state"],
                "status": r["status"],
                "attempts": str(r["attempts"]),
                "errors": str(r["errors"]),
                "restarts": str(r["restarts"]),
                "due": fmt.due_in(
                    r["due_at"],
                    now,
                    r["status"],
                    running=r.get("running_attempt") is not None,
                )
                or "-",
                "lock": fmt.lock(r["locked_by"], r["locked_until"], now) or "-",
                "last_error": error_line(err, LAST_ERROR_WIDTH),
            }
        )
    table = INSTANCE_COLUMNS
    if not any(c["label"] for c in cells):  # a label column only where some flow has one
        table = tuple(col for col in table if col[1] != "label")
    natural = {
        key: max([_cells(head)] + [_cells(c[key]) for c in cells]) for head, key, _m, _r in table
    }
    shown = fit_columns(table, natural, width, SHRINK_ORDER)
    columns = []
    for head, key, _m, _r in table:
        if key in shown:
            columns.append(_pad_column([head] + [c[key] for c in cells], shown[key]))
    lines = ["  ".join(parts).rstrip() for parts in zip(*columns, strict=True)]
    lines[0] = click.style(lines[0], bold=True)
    lines.append(f"{len(rows)} instance{'s' if len(rows) != 1 else ''}")
    click.echo("\n".join(lines))


def _pad_column(values: list[str], width: int) -> list[str]:
    """``values`` clipped (with ``…``) and padded to ``width`` terminal cells."""
    if "".join(values).isascii():  # the common case: one cell per character
        return [v.ljust(width) if len(v) <= width else v[: width - 1] + "…" for v in values]
    out = []
    for v in values:
        v = _clip(v, width)
        out.append(v + " " * (width - _cells(v)))
    return out


def instance_detail(item: dict) -> None:
    """Print one instance, its error budget, data, checkpoints and attempt history."""
    _out, Table = _rich()
    for key in (
        "id",
        "flow",
        "label",
        "version",
        "state",
        "status",
        "attempts",
        "errors",
        "restarts",
        "due_at",
        "locked_by",
        "locked_until",
        "created_at",
        "updated_at",
        "last_error",
    ):
        _out.print(f"[bold]{key:>13}[/bold]  {item.get(key) if item.get(key) is not None else '-'}")
    b = item.get("budget")
    if b:
        _out.print(
            f"[bold]{'error budget':>13}[/bold]  {b['used']} used, {b['left']} left of {b['max']} "
            f"in {b['window']:g}s (then {b['on_exhausted']}); "
            f"restarts {b['restarts']}/{b['max_restarts']}"
        )
    _out.print(f"[bold]{'data':>13}[/bold]  {json.dumps(item['data'])}")
    t = Table(title="attempts", box=None, header_style="bold", title_justify="left")
    for col in ("#", "state", "worker", "started", "secs", "outcome", "to", "error"):
        t.add_column(col, overflow="fold" if col == "error" else "ellipsis")
    for a in item["history"]:
        t.add_row(
            str(a["attempt"]),
            a["state"],
            a["worker"],
            a["started_at"] or "-",
            f"{a['duration']:.3f}" if a["duration"] is not None else "running",
            a["outcome"] or "-",
            a["to_state"] or "",
            a["error"] or "",  # the whole kept tail
        )
    _out.print(t)
    for cp in item.get("checkpoints", []):
        _out.print(
            f"checkpoint of attempt {cp['attempt']} in {cp['state']}: "
            f"{json.dumps(cp['checkpoint'], sort_keys=True)}",
            markup=False,
        )
    for cmd in item.get("commands", []):
        _out.print(
            f"command {cmd['command']} from {cmd['source']} at {cmd['at']}: "
            f"{cmd['status']}: {cmd['result']}"
        )


def events_table(rows: list[dict]) -> None:
    """Print sensor events and what the rules did."""
    _out, Table = _rich()
    t = Table(box=None, header_style="bold")
    for col in ("id", "sensor", "key", "created", "handled", "action"):
        t.add_column(col, overflow="ellipsis")
    for r in rows:
        t.add_row(
            str(r["id"]),
            r["sensor"],
            str(r["key"])[:50],
            r["created_at"] or "-",
            r["handled_at"] or "pending",
            r.get("action") or "",
        )
    _out.print(t)


def workers_table(rows: list[dict]) -> None:
    """Print workers (``runner.ops.liveness.list_workers``) with heartbeat age, running
    attempts, valid leases and the liveness verdict (alive/late/dead/stopped)."""
    _out, Table = _rich()
    t = Table(box=None, header_style="bold")
    for col in ("id", "host", "pid", "started", "heartbeat", "running", "leases", "state"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["id"],
            r["host"],
            str(r["pid"]),
            r["started_at"],
            _ago(r["heartbeat_at"]) + " ago",
            str(r["running"]),
            str(r["leases"]),
            r["verdict"],
        )
    _out.print(t)
