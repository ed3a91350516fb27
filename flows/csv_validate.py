"""Validate one CSV file: the ``validate`` state of the ``csv_ingest`` example flow.

Usage: ``python -m csv_validate PATH [--min-rows N]`` (run with the flows folder as the
working directory, as flowrun does for ``exec`` handlers).

Rules (each broken rule is one *defect*, aggregated per rule and column):

* the file is UTF-8 text (a byte-order mark is allowed) that the ``csv`` module can parse;
* it has a header row whose column names are non-empty and unique;
* it has at least ``--min-rows`` data rows;
* every row has as many fields as the header (no ragged rows, no blank lines);
* no cell is missing: empty, or a missing-value marker such as ``NA``, ``N/A``, ``NaN``
  or ``null``.

A file with defects is not an *error*: under flowrun (``FLOWRUN_INSTANCE`` set) the
defects are checkpointed into the instance data, the instance is sent to ``quarantine``
through the control channel, and the exit code is 0. Run by hand, the script exits 1
on defects, so it is also an ordinary command-line checker. A file that cannot be read
at all (missing, permission denied) is a real error: exit 1 under flowrun too, so the
attempt is retried with backoff and spends error budget.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import defaultdict
from pathlib import Path

#: Cell values that mean "no value" (compared stripped and case-insensitively).
MISSING_MARKERS = frozenset({"", "na", "n/a", "nan", "null"})
#: How many line numbers one defect message lists before "...".
MAX_LINES = 5


def _lines(numbers: list[int]) -> str:
    """``"lines 2, 3 and 7"`` with at most ``MAX_LINES`` numbers shown."""
    shown = ", ".join(str(n) for n in numbers[:MAX_LINES])
    more = len(numbers) - MAX_LINES
    word = "line" if len(numbers) == 1 else "lines"
    return f"{word} {shown}" + (f" and {more} more" if more > 0 else "")


def validate(path: Path, min_rows: int = 1) -> tuple[list[str], int]:
    """Check ``path`` against the rules above.

    Returns:
        ``(defects, rows)``: one human-readable message per broken rule (empty when the
        file is valid) and the number of data rows read.

    Raises:
        OSError: the file cannot be opened or read.
    """
    defects: list[str] = []
    ragged: dict[int, list[int]] = defaultdict(list)  # field count -> line numbers
    blank: list[int] = []
    missing: dict[int, list[int]] = defaultdict(list)  # column index -> line numbers
    markers: dict[int, set[str]] = defaultdict(set)  # column index -> markers seen
    header: list[str] | None = None
    rows = 0
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        try:
            for row in reader:
                if header is None:
                    header = row
                    continue
                if not row:
                    blank.append(reader.line_num)
                    continue
                rows += 1
                if len(row) != len(header):
                    ragged[len(row)].append(reader.line_num)
                for index, value in enumerate(row[: len(header)]):
                    if value.strip().lower() in MISSING_MARKERS:
                        missing[index].append(reader.line_num)
                        markers[index].add(value.strip())
        except UnicodeDecodeError as exc:
            return [
                f"not UTF-8 text: {exc.reason} (byte 0x{exc.object[exc.start]:02x}) "
                f"after line {reader.line_num}; is this really a CSV file?"
            ], rows
        except csv.Error as exc:
            return [f"line {reader.line_num}: not parseable as CSV ({exc})"], rows

    if header is None:
        return ["empty file: no header row"], 0
    names = [name.strip() for name in header]
    if any(not name for name in names):
        empty = [str(i + 1) for i, name in enumerate(names) if not name]
        defects.append(f"header (line 1): column {', '.join(empty)} has no name")
    duplicates = sorted({name for name in names if name and names.count(name) > 1})
    if duplicates:
        defects.append(f"header (line 1): duplicate column names {', '.join(duplicates)}")
    if rows < min_rows:
        defects.append(f"{rows} data rows, at least {min_rows} required")
    for count, numbers in sorted(ragged.items()):
        rows_word = "row has" if len(numbers) == 1 else "rows have"
        defects.append(
            f"{len(numbers)} {rows_word} {count} fields, the header has "
            f"{len(header)} ({_lines(numbers)})"
        )
    if blank:
        defects.append(
            f"{len(blank)} blank {'line' if len(blank) == 1 else 'lines'} ({_lines(blank)})"
        )
    for index, numbers in sorted(missing.items()):
        seen = ", ".join(repr(m) if m else "empty" for m in sorted(markers[index]))
        value_word = "value" if len(numbers) == 1 else "values"
        defects.append(
            f"column {names[index] or index + 1!r}: {len(numbers)} missing "
            f"{value_word} ({seen}) at {_lines(numbers)}"
        )
    return defects, rows


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="csv_validate", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the CSV file to check")
    parser.add_argument("--min-rows", type=int, default=1, help="data rows required (1)")
    args = parser.parse_args(argv)
    under_flowrun = "FLOWRUN_INSTANCE" in os.environ
    try:
        defects, rows = validate(args.path, args.min_rows)
    except OSError as exc:
        print(f"csv_validate: cannot read {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if not defects:
        print(f"{args.path.name}: valid, {rows} data rows")
        if under_flowrun:
            from runner.control import checkpoint

            checkpoint({"defects": []})  # clear the defects of an earlier quarantine
        return 0
    print(f"csv_validate: {args.path.name}: {len(defects)} defect(s):", file=sys.stderr)
    for defect in defects:
        print(f"  - {defect}", file=sys.stderr)
    if not under_flowrun:
        return 1
    from runner.control import checkpoint, goto

    checkpoint({"defects": defects})
    goto("quarantine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
