"""``call`` handlers of the ``csv_ingest`` example flow: ``summarise`` and ``archive``.

Both take flowrun's handler context (``runner.control.Context``: ``ctx.data``,
``ctx.instance_id``, ``ctx.cancelled``, ``ctx.checkpoint(dict)``, ``ctx.keepalive()``) and
return the name of the next state.
Relative paths in the instance data resolve against the flows folder (this file's
folder), whatever the daemon's working directory is.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.control import Context

FLOWS = Path(__file__).resolve().parent
#: Rows between two ``ctx.keepalive()`` calls while summarising.
KEEPALIVE_ROWS = 2000


def resolve(path: str | os.PathLike[str]) -> Path:
    """``path`` as is when absolute, else relative to the flows folder."""
    p = Path(path)
    return p if p.is_absolute() else FLOWS / p


def _number(value: str) -> float | None:
    """The finite float in ``value``, or ``None``."""
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def summarise_file(path: Path, keepalive: Callable[[], None] | None = None) -> dict[str, Any]:
    """Statistics of a (validated) CSV file.

    Returns ``{"rows", "columns", "numeric": {column: {min, max, mean}}, "text": {column:
    {distinct, top}}}``; a column is numeric when every value is a finite number.
    """
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        columns = next(reader)
        numbers: list[list[float] | None] = [[] for _ in columns]
        counts: list[dict[str, int]] = [{} for _ in columns]
        rows = 0
        for rows, row in enumerate(reader, 1):
            for index, value in enumerate(row[: len(columns)]):
                counts[index][value] = counts[index].get(value, 0) + 1
                column = numbers[index]
                if column is not None:
                    number = _number(value)
                    if number is None:
                        numbers[index] = None
                    else:
                        column.append(number)
            if keepalive is not None and rows % KEEPALIVE_ROWS == 0:
                keepalive()
    numeric: dict[str, dict[str, float]] = {}
    text: dict[str, dict[str, Any]] = {}
    for name, values, seen in zip(columns, numbers, counts, strict=True):
        if values:
            numeric[name] = {
                "min": min(values),
                "max": max(values),
                "mean": round(statistics.fmean(values), 4),
            }
        else:
            top = max(seen.items(), key=lambda item: item[1]) if seen else ("", 0)
            text[name] = {"distinct": len(seen), "top": top[0], "top_count": top[1]}
    return {"rows": rows, "columns": columns, "numeric": numeric, "text": text}


def summarise(ctx: Context) -> str:
    """State ``summarise``: checkpoint ``data.summary`` with the file's statistics."""

    def beat() -> None:  # every KEEPALIVE_ROWS rows: stop if cancelled, else keepalive
        if ctx.cancelled:
            raise RuntimeError("attempt cancelled")
        ctx.keepalive()

    summary = summarise_file(resolve(ctx.data["path"]), keepalive=beat)
    ctx.checkpoint({"summary": summary})
    return "archive"


def _free_name(folder: Path, name: str, instance_id: int) -> Path:
    """``folder/name``, or ``folder/<stem>-<instance_id><suffix>`` when that is taken."""
    target = folder / name
    if not target.exists():
        return target
    stem, suffix = os.path.splitext(name)
    return folder / f"{stem}-{instance_id}{suffix}"


def archive(ctx: Context) -> str:
    """State ``archive``: move the file into ``data.archive_dir`` next to its summary.

    Writes ``<stem>.summary.json`` (the summary plus where the file came from), then
    moves the file. Safe to run again after a lost attempt: the destination is
    checkpointed before anything moves, and a file already moved counts as done.
    """
    source = resolve(ctx.data["path"])
    if "archived_to" in ctx.data:
        target = resolve(ctx.data["archived_to"])
    else:
        folder = resolve(ctx.data.get("archive_dir", "archive"))
        folder.mkdir(parents=True, exist_ok=True)
        target = _free_name(folder, source.name, ctx.instance_id)
        ctx.checkpoint({"archived_to": str(target)})
    report = {
        "file": source.name,
        "source": str(source),
        "instance": ctx.instance_id,
        "archived_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "summary": ctx.data.get("summary"),
    }
    summary_path = target.with_suffix(".summary.json")
    partial = summary_path.with_name(summary_path.name + ".part")
    partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, summary_path)
    if source.exists():
        shutil.move(source, target)
    elif not target.exists():
        raise FileNotFoundError(f"{source} is gone and was never archived to {target}")
    return "done"
