"""A flow file with field errors, validated without its broken parts, so the graph-level
checks and the ``call`` imports still run and one ``flowrun check`` reports every
independent mistake of a file (not the field errors first, then, once fixed, the rest).

:func:`leave_out` is what the loader validates again after a field error: the file's
plain data without the nodes that failed (a bad key, a bad value, a mapping missing a
required key, an entry with an invalid name). A :class:`LeftOut` remembers those nodes
and how the list indexes moved, so a check's location maps back to the file; the checks
that a missing part could mislead (a target naming a left-out state, reachability, a
rule naming a left-out sensor) stay quiet (:class:`Gaps`). YAML syntax errors and the
bounds of ``runner.flowspec.limits`` stop before any of this: there is no data to check.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Loc = tuple[str | int, ...]
"""A location in the file: YAML keys and list indexes, e.g. ``("states", "a", "next")``."""


@dataclass(frozen=True)
class Gaps:
    """What a check must not trust in a partly valid flow (all empty for a valid one).

    Attributes:
        states: names of states left out whole (a target naming one is not reported).
        sensors: names of sensors left out whole (a rule naming one is not reported).
        edges: some part a state's ways out depend on was left out (a state, its
            ``next``/``to``/``on``/``error_budget``/handler, the ``initial`` or the default
            error budget): reachability and ``send`` events unknown.
    """

    states: frozenset[str] = frozenset()
    sensors: frozenset[str] = frozenset()
    edges: bool = False


@dataclass
class LeftOut:
    """The nodes of a file left out to validate the rest (locations in the file), and
    ``moved``: for each list that lost items, the file indexes of the items kept."""

    nodes: set[Loc] = field(default_factory=set)
    moved: dict[Loc, list[int]] = field(default_factory=dict)

    def in_file(self, loc: Loc) -> Loc:
        """``loc`` in the data validated (list indexes shifted) as a location in the file."""
        out: list[Any] = []
        for seg in loc:
            kept = self.moved.get(tuple(out))
            if isinstance(seg, int) and kept is not None and 0 <= seg < len(kept):
                seg = kept[seg]
            out.append(seg)
        return tuple(out)

    def touches(self, loc: Loc) -> bool:
        """Whether the node at ``loc`` (in the data validated) contains or lies inside a
        node left out: a check about it could be about the missing part."""
        at = self.in_file(loc)
        return any(at[: len(n)] == n or n[: len(at)] == at for n in self.nodes)

    def hides(self, loc: Loc) -> bool:
        """Whether a cross-flow problem at ``loc`` (in the data validated) could come from
        a node left out rather than be a mistake of its own: ``loc`` touches one (a flow
        name that clashes after ``flow:`` was left out: ``("flow",)``), or it is a pool
        problem (``pools``, a state's ``pool``) while a pool declaration was left out."""
        if self.touches(loc):
            return True
        pooled = loc[:1] == ("pools",) or loc[-1:] == ("pool",)
        return pooled and any(n[:1] == ("pools",) for n in self.nodes)

    def gaps(self, data: Any) -> Gaps:
        """The :class:`Gaps` these left-out nodes make in the file's plain ``data``."""

        def whole(section: str) -> frozenset[str]:
            if (section,) in self.nodes:
                names = data.get(section) if isinstance(data, dict) else None
                return frozenset(names) if isinstance(names, dict) else frozenset()
            names = (n[1] for n in self.nodes if len(n) == 2 and n[0] == section)
            return frozenset(n for n in names if isinstance(n, str))  # a name is a key

        return Gaps(whole("states"), whole("sensors"), any(map(_edge_node, self.nodes)))


#: A state's keys its ways out depend on (``exec``/``call``: ``on_exhausted`` applies).
_EDGE_KEYS = ("next", "to", "on", "error_budget", "exec", "call")


def _edge_node(loc: Loc) -> bool:
    """Whether leaving out the node at ``loc`` may hide a way from one state to another."""
    if loc[:1] == ("states",):
        return len(loc) <= 2 or loc[2] in _EDGE_KEYS
    return loc[:1] == ("initial",) or loc[:2] in (("defaults",), ("defaults", "error_budget"))


def cut_for(loc: Loc, kind: str, known: Any) -> Loc:
    """The node to leave out for one pydantic error of type ``kind`` at ``loc`` (in the
    file): a mapping missing a required key goes whole, an entry with an invalid name
    goes whole, anything else goes at the deepest node of ``loc`` the file has
    (``known``: a container of the file's locations). ``()`` means the whole file."""
    if "[key]" in loc:
        return tuple(loc[: loc.index("[key]")])
    if kind == "missing":
        return tuple(loc[:-1])
    loc = tuple(loc)
    while loc and loc not in known:
        loc = loc[:-1]
    return loc


def leave_out(data: Any, left: LeftOut) -> Any:
    """``data`` (the file's plain values) without the nodes of ``left``; records in
    ``left.moved`` the indexes kept of each list that lost items."""
    left.moved.clear()

    def walk(node: Any, loc: Loc) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, (*loc, k)) for k, v in node.items() if (*loc, k) not in left.nodes}
        if isinstance(node, list):
            kept = [i for i in range(len(node)) if (*loc, i) not in left.nodes]
            if len(kept) != len(node):
                left.moved[loc] = kept
            return [walk(node[i], (*loc, i)) for i in kept]
        return node

    return walk(data, ())
