"""Stage real input for the ``csv_ingest`` example flow into ``flows/inbox/``.

Copies, unchanged, every CSV file shipped by the ``vega_datasets`` package (install it
with ``pip install -e '.[examples]'``) and, when this system has it, Debian's release
table ``/usr/share/distro-info/debian.csv`` (package ``distro-info-data``) as
``debian-releases.csv``. Prints what it staged and from where.

Idempotent: a file already in the inbox with the same content, or already archived by
the flow (``../archive/<name>`` next to the inbox, same content), is not copied again.
Each copy is written under a hidden temporary name and renamed, so the inbox sensor
never sees a half-written file.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Real files of the operating system, staged when present: {name in inbox: source}.
SYSTEM_FILES = {"debian-releases.csv": Path("/usr/share/distro-info/debian.csv")}


def vega_data_dir() -> Path | None:
    """The ``_data`` folder of the installed ``vega_datasets`` package (not imported)."""
    spec = importlib.util.find_spec("vega_datasets")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "_data"
    return folder if folder.is_dir() else None


def sources() -> dict[str, Path]:
    """Every input file to stage: {name in the inbox: source path}."""
    found: dict[str, Path] = {}
    vega = vega_data_dir()
    if vega is not None:
        found.update({path.name: path for path in sorted(vega.glob("*.csv"))})
    found.update(SYSTEM_FILES)
    return found


def _same(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def stage(dest: Path) -> list[tuple[str, Path, str]]:
    """Copy the input into ``dest``; returns ``(name, source, action)`` per file.

    ``action`` is ``staged``, ``present`` (same file already in ``dest``), ``archived``
    (already processed into ``dest/../archive``) or ``missing`` (not on this system).
    """
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / "archive"
    done: list[tuple[str, Path, str]] = []
    for name, source in sources().items():
        target = dest / name
        if not source.is_file():
            action = "missing"
        elif _same(source, target):
            action = "present"
        elif _same(source, archive / name):
            action = "archived"
        else:
            partial = dest / f".{name}.part"
            shutil.copyfile(source, partial)
            os.replace(partial, target)
            action = "staged"
        done.append((name, source, action))
    return done


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="stage_input", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dest",
        type=Path,
        default=HERE / "inbox",
        help="folder to stage into (default: the inbox next to this script)",
    )
    args = parser.parse_args(argv)
    if vega_data_dir() is None:
        print(
            "stage_input: the vega_datasets package is not installed; run "
            "`pip install -e '.[examples]'` first",
            file=sys.stderr,
        )
        return 1
    notes = {
        "staged": "",
        "present": "  (already in the inbox)",
        "archived": "  (already processed, see archive/)",
        "missing": "  (not on this system, skipped)",
    }
    for name, source, action in stage(args.dest):
        print(f"{action:<8} {name:<22} <- {source}{notes[action]}")
    print(f"inbox: {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
