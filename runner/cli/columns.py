"""Plain-text tables fitted to the terminal: widths in cells, columns that shrink then
drop by their value to an operator (``fit_columns``), the lines of such a table
(``plain_table``). The CLI's tables are in ``runner.cli.render``."""

from __future__ import annotations

import shutil

import click


def terminal_width(width: int | None = None) -> int:
    """``width``, or the terminal's width in cells (``COLUMNS`` when set, 80 when piped)."""
    return width if width is not None else shutil.get_terminal_size((80, 24)).columns


def cell_width(s: str) -> int:
    """``s``'s width in terminal cells (wide characters take two)."""
    if s.isascii():
        return len(s)
    from rich.cells import cell_len

    return cell_len(s)


def clip(s: str, width: int) -> str:
    """``s`` cut to ``width`` terminal cells, its last cell ``…`` when cut."""
    if cell_width(s) <= width:
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
    ranked = sorted((c for c in columns if c[3] is not None), key=lambda c: c[3] or 0)
    droppable = [c[1] for c in ranked]
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


def plain_table(
    table: tuple[tuple[str, str, int | None, int | None], ...],
    cells: list[dict[str, str]],
    width: int,
    shrink_order: tuple[str, ...],
) -> list[str]:
    """The lines of a plain-text table (header bold on a terminal) fitted to ``width``
    cells by :func:`fit_columns`: ``table`` is ``INSTANCE_COLUMNS``-shaped, ``cells`` one
    dict per row (key → text already made literal)."""
    natural = {
        key: max([cell_width(head)] + [cell_width(c[key]) for c in cells])
        for head, key, _m, _r in table
    }
    shown = fit_columns(table, natural, width, shrink_order)
    columns = []
    for head, key, _m, _r in table:
        if key in shown:
            columns.append(pad_column([head] + [c[key] for c in cells], shown[key]))
    lines = ["  ".join(parts).rstrip() for parts in zip(*columns, strict=True)]
    lines[0] = click.style(lines[0], bold=True)
    return lines


def pad_column(values: list[str], width: int) -> list[str]:
    """``values`` clipped (with ``…``) and padded to ``width`` terminal cells."""
    if "".join(values).isascii():  # the common case: one cell per character
        return [v.ljust(width) if len(v) <= width else v[: width - 1] + "…" for v in values]
    out = []
    for v in values:
        v = clip(v, width)
        out.append(v + " " * (width - cell_width(v)))
    return out
