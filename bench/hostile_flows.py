"""How long and how much memory ``flowrun check`` needs to refuse each hostile flow file
(``tests/support/hostile.py``: alias bomb, 10,000-deep list, 10 MB file, recursive alias,
Latin-1, NUL, C1).

For each file: the wall time and peak RSS of a real ``flowrun check`` subprocess, and the
in-process time of ``load_flow`` alone (the subprocess time is mostly Python start-up
and imports; ``flowrun check`` on a good one-state flow is printed as the peer). Goal: every
hostile file refused in under 2 s, under 200 MB.

Usage: ``.venv/bin/python bench/hostile_flows.py``
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.errors import FlowErrors  # noqa: E402
from runner.flowspec.compiler import load_flow  # noqa: E402
from tests.support.hostile import CASES, GOOD  # noqa: E402


def main() -> None:
    flowrun = Path(sys.executable).parent / "flowrun"
    with tempfile.TemporaryDirectory() as tmp:
        files = [("good (peer)", Path(tmp) / "good.yaml", GOOD.encode())]
        files += [(c.name, Path(tmp) / f"{c.name}.yaml", c.data) for c in CASES]
        print(f"{'file':12} {'bytes':>9} {'check s':>8} {'peak MB':>8} {'load ms':>8}  answer")
        for name, path, data in files:
            path.write_bytes(data)
            t0 = time.perf_counter()
            proc = subprocess.run(
                [str(flowrun), "check", str(path)], capture_output=True, text=True, timeout=120
            )
            wall = time.perf_counter() - t0
            # ru_maxrss of children is the largest so far; each file is larger than the peer
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            t0 = time.perf_counter()
            try:
                load_flow(path)
            except FlowErrors:
                pass
            load = (time.perf_counter() - t0) * 1000
            answer = (proc.stderr or proc.stdout).strip().splitlines()
            line = f"exit {proc.returncode}: {answer[0][len(str(path)) :][:60] if answer else ''}"
            print(f"{name:12} {len(data):9} {wall:8.2f} {peak:8.0f} {load:8.1f}  {line}")


if __name__ == "__main__":
    main()
