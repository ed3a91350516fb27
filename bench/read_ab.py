"""Read commands on a given database, this install against another, interleaved (not a test).

Each round runs ``python -m runner.cli ARGS`` once under each interpreter (whole processes,
output discarded) for every case; prints the median and best wall ms per case and install,
and the ratio of the medians (this / peer), as one JSON object. Interleaving keeps the
ratio honest on a shared, noisy machine. The first round is a warm-up (not counted): it
fills the flow-facts cache (``runner.flowspec.facts``) where an install has one.

    FLOWRUN_DB=sqlite:////path/flowrun.db python bench/read_ab.py --peer /other/.venv/bin/python \\
        [--runs 15] [--id 50000]

Cases: ``show ID``, ``show --json ID``, ``explain ID``, ``ls --limit 50``,
``events --limit 50`` (the issue's goals: 200, -, 300, 300, 300 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def wall_ms(python: str, args: list[str]) -> float:
    """Wall ms of one ``python -m runner.cli ARGS`` (raises on a non-zero exit)."""
    t0 = time.perf_counter()
    subprocess.run([python, "-m", "runner.cli", *args], check=True, capture_output=True)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", required=True, help="the other install's python")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--id", default="1", help="the instance that show/explain read")
    a = ap.parse_args()
    cases = {
        "show": ["show", a.id],
        "show_json": ["show", "--json", a.id],
        "explain": ["explain", a.id],
        "ls_limit_50": ["ls", "--limit", "50"],
        "events_limit_50": ["events", "--limit", "50"],
    }
    pythons = {"this": sys.executable, "peer": a.peer}
    times: dict[str, dict[str, list[float]]] = {c: {p: [] for p in pythons} for c in cases}
    for rnd in range(a.runs + 1):
        for case, args in cases.items():
            for name, python in pythons.items():
                ms = wall_ms(python, args)
                if rnd:
                    times[case][name].append(ms)
    report = {}
    for case, by in times.items():
        med = {p: statistics.median(v) for p, v in by.items()}
        report[case] = {
            **{f"{p}_median_ms": round(m, 1) for p, m in med.items()},
            **{f"{p}_best_ms": round(min(v), 1) for p, v in by.items()},
            "ratio": round(med["this"] / med["peer"], 3),
        }
    print(json.dumps({"runs": a.runs, "cases": report}, indent=2))


if __name__ == "__main__":
    main()
