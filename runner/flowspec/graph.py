"""A compiled flow's state graph as text: Mermaid ``stateDiagram-v2`` or Graphviz ``dot``.

Pure text from ``CompiledFlow.edges()`` (the compiled machine's transitions and the
``on_exhausted`` moves, labelled so), the initial state and the terminal states;
optionally one state highlighted as ``current``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

FORMATS = ("mermaid", "dot")
"""The graph formats ``render_graph`` knows."""

EXHAUSTED = "on_exhausted"
"""The label of a handler state's ``on_exhausted`` edge (dashed in ``dot``)."""


def render_graph(flow: CompiledFlow, fmt: str = "mermaid", current: str | None = None) -> str:
    """The state graph of ``flow`` as Mermaid or Graphviz ``dot`` text (ending in a newline).

    Args:
        flow: a compiled flow.
        fmt: ``"mermaid"`` or ``"dot"``.
        current: a state to highlight (e.g. an instance's state), or ``None``; a name that
            is not a state of ``flow`` (e.g. a state of an older version) is ignored.

    Raises:
        ValueError: ``fmt`` is not a known format.
    """
    terminal = [s for s, st in flow.states.items() if st.kind == "terminal"]
    if current not in flow.states:
        current = None  # e.g. a state of an older version: nothing to highlight
    if fmt == "mermaid":
        return _mermaid(flow, terminal, current)
    if fmt == "dot":
        return _dot(flow, terminal, current)
    raise ValueError(f"unknown graph format {fmt!r} (expected mermaid or dot)")


def _mermaid(flow: CompiledFlow, terminal: list[str], current: str | None) -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {flow.initial}"]
    for src, dst, label in flow.edges():
        lines.append(f"    {src} --> {dst}" + (f": {label}" if label else ""))
    lines += [f"    {s} --> [*]" for s in terminal]
    lines.append("    classDef terminal fill:#e0e0e0,stroke:#616161")
    lines.append("    classDef current fill:#ffd54f,stroke:#f57f17,stroke-width:3px")
    lines += [f"    class {s} terminal" for s in terminal]
    if current is not None:
        lines.append(f"    class {current} current")
    return "\n".join(lines) + "\n"


def _dot(flow: CompiledFlow, terminal: list[str], current: str | None) -> str:
    lines = [
        f'digraph "{flow.name}" {{',
        "    rankdir=LR;",
        "    node [shape=box, style=rounded];",
        '    "__start__" [shape=point, label=""];',
        f'    "__start__" -> "{flow.initial}";',
    ]
    lines += [f'    "{s}" [shape=doublecircle];' for s in terminal]
    if current is not None:
        lines.append(
            f'    "{current}" [style="rounded,filled,bold", fillcolor="#ffd54f", '
            'penwidth=3, xlabel="current"];'
        )
    for src, dst, label in flow.edges():
        style = ", style=dashed" if label == EXHAUSTED else ""
        lines.append(f'    "{src}" -> "{dst}"' + (f' [label="{label}"{style}];' if label else ";"))
    lines.append("}")
    return "\n".join(lines) + "\n"
