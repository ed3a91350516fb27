"""Pools across flow files: every file declaring a pool gives it the same number of
slots, and a state's ``pool`` names a pool some file of the folder declares.

One file's own checks (``slots`` needs ``pool``, no more slots than the file's pool has)
are in ``runner.flowspec.checks``; these need every flow of the folder
(``runner.flowspec.registry.FlowRegistry``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.loader import did_you_mean


def pool_problems(
    flows: Iterable[CompiledFlow],
) -> Iterator[tuple[CompiledFlow, str, tuple[str | int, ...]]]:
    """The pool problems of a set of flows, as ``(flow, message, loc)`` (``loc``: the key
    path in that flow's YAML): a pool declared with different slots in two files (one
    problem at each declaration), a state naming a pool no flow declares, a state taking
    more slots than its pool (declared in another file) has."""
    flows = sorted(flows, key=lambda f: f.path)
    declared: dict[str, list[tuple[CompiledFlow, str]]] = {}
    for flow in flows:
        rates = flow.pool_rates
        for name, slots in flow.pools.items():
            text = f"{slots} slots" + (f", rate {rates[name]}" if name in rates else "")
            declared.setdefault(name, []).append((flow, text))
    for name, decls in declared.items():
        if len({text for _, text in decls}) < 2:
            continue
        for flow, text in decls:
            others = ", ".join(
                f"{Path(f.path).name} ({t})" for f, t in decls if f is not flow and t != text
            )
            yield (
                flow,
                f"pool '{name}' is declared with {text} here and differently in "
                f"{others}: every file declaring a pool declares it alike",
                ("pools", name),
            )
    for flow in flows:
        for state in flow.states.values():
            if state.pool is None:
                continue
            found = declared.get(state.pool)
            if not found:
                yield (
                    flow,
                    f"unknown pool '{state.pool}'{did_you_mean(state.pool, declared)}: declare "
                    f"it under 'pools' in a flow file (pools: {{{state.pool}: N}})",
                    ("states", state.name, "pool"),
                )
                continue
            size = min(f.pools[state.pool] for f, _ in found)
            if state.slots > size and state.pool not in flow.pools:
                yield (
                    flow,
                    f"state '{state.name}' takes {state.slots} slots of pool "
                    f"'{state.pool}', which has {size}",
                    ("states", state.name, "slots"),
                )
