"""Interleaved A/B of flowrun's throughput between two source trees (not a test).

On a shared or noisy machine, two ``bench/throughput.py`` runs minutes apart measure the
load as much as the code. This drains the same instances with tree A and tree B
alternately (the order flips every round), through ``throughput.run_flowrun`` with
``PYTHONPATH`` set to each tree, and prints transitions/s and the daemon's CPU time
(user + sys, start-up included, from ``getrusage``) per transition, then the medians.

    git archive main | tar -x -C /tmp/base      # the old tree
    python bench/throughput_ab.py --rounds 5 /tmp/base .
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import throughput  # noqa: E402

CASES = ("noop", "fail_once")


def _cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree_a", help="source tree A (the folder holding runner/)")
    ap.add_argument("tree_b", help="source tree B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    trees = [str(Path(args.tree_a).resolve()), str(Path(args.tree_b).resolve())]
    rates: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in CASES}
    cpus: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in CASES}
    for r in range(args.rounds):
        for case in CASES:
            for tree in trees if r % 2 == 0 else trees[::-1]:
                os.environ["PYTHONPATH"] = tree
                before = _cpu()
                with tempfile.TemporaryDirectory(prefix="flowrun-ab-") as tmp:
                    fr = throughput.run_flowrun(args.n, args.concurrency, case, Path(tmp))
                us = (_cpu() - before) / fr["transitions"] * 1e6
                rates[tree, case].append(fr["per_s"])
                cpus[tree, case].append(us)
                print(
                    f"round {r} {case:9} {tree}: {fr['per_s']:,.0f}/s, {us:.1f} us cpu/transition"
                )
    for case in CASES:
        (ra, rb), (ca, cb) = ([statistics.median(d[t, case]) for t in trees] for d in (rates, cpus))
        print(
            f"[{case}] medians of {args.rounds}: A {ra:,.0f}/s {ca:.1f} us; B {rb:,.0f}/s "
            f"{cb:.1f} us; rate B/A {rb / ra:.3f}, cpu B/A {cb / ca:.3f}"
        )


if __name__ == "__main__":
    main()
