"""The flows folder: every ``*.yaml``/``*.yml`` file compiled, cross-checked, hot-reloadable.

A file with errors never replaces the good version already loaded from it; its errors
are kept in ``FlowRegistry.errors`` (by file path) until the file is fixed or deleted.
:meth:`FlowRegistry.stale` names the files changed since they were last read, for a
watcher that starts (or restarts) after the load and must not miss an edit in between.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from runner.errors import FlowError, FlowErrors, UserError
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.compiler import PartialFlow, load_flow
from runner.flowspec.loader import did_you_mean
from runner.flowspec.pool_checks import pool_problems
from runner.flowspec.spec_rules import DELIVERED
from runner.flowspec.webhook_checks import webhook_problems

SUFFIXES = (".yaml", ".yml")


class FlowRegistry:
    """All flows of one folder (not recursive).

    Attributes:
        folder: the flows folder (put on ``sys.path`` once, for ``call`` handlers).
        flows: flow name -> the loaded ``CompiledFlow``.
        by_path: file path (``str(folder / name)``) -> the ``CompiledFlow`` loaded from it.
        errors: file path -> the ``FlowError`` list of its last load (absent when clean).

    ``check``, when given, is asked about each flow that compiled: errors it returns
    refuse that file as its own errors would (the daemon's ``privilege_errors``).
    """

    def __init__(
        self,
        folder: Path | str,
        check: Callable[[CompiledFlow], list[FlowError]] | None = None,
    ):
        self.folder = Path(folder)
        self._check = check  # more errors of a compiled flow (the daemon's)
        self.flows: dict[str, CompiledFlow] = {}
        self.by_path: dict[str, CompiledFlow] = {}
        self.errors: dict[str, list[FlowError]] = {}
        self._compile_errors: dict[str, list[FlowError]] = {}
        self._cross_errors: dict[str, list[FlowError]] = {}
        self._seen: dict[str, tuple[int, int, int]] = {}  # path -> signature when read
        here = str(self.folder.resolve())
        if here not in sys.path:
            sys.path.insert(0, here)

    def files(self) -> list[Path]:
        """The flow files currently in the folder, sorted by name."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if p.suffix in SUFFIXES and p.is_file())

    def _key(self, path: Path | str) -> str | None:
        p = Path(path)
        if p.suffix not in SUFFIXES:
            return None
        if p.parent.resolve() != self.folder.resolve():
            return None
        return str(self.folder / p.name)

    def load_all(self) -> list[FlowError]:
        """(Re)load every flow file of the folder; returns all errors found."""
        keys = {str(p) for p in self.files()} | set(self.by_path) | set(self._compile_errors)
        return self.reload(sorted(keys))

    def get(self, name: str) -> CompiledFlow:
        """The loaded flow called ``name``; raises ``UserError(..., 2)`` when unknown."""
        try:
            return self.flows[name]
        except KeyError:
            known = ", ".join(sorted(self.flows)) or "none"
            raise UserError(f"unknown flow '{name}' (known: {known})", 2) from None

    def reload(self, paths: Iterable[Path | str]) -> list[FlowError]:
        """Recompile only ``paths`` (files of this folder; others are ignored).

        A file that fails keeps its previously loaded good version; a deleted file
        removes its flow. Cross-flow checks (duplicate flow names, rules naming unknown
        flows, states or events) run over the whole set afterwards; a reloaded file
        that fails them is rejected like any bad file.

        Returns:
            The errors of the reloaded files plus new cross-flow errors of other files.
        """
        keys = list(dict.fromkeys(k for k in map(self._key, paths) if k is not None))
        fresh: dict[str, CompiledFlow] = {}
        compile_errors: dict[str, list[FlowError]] = {}
        partials: dict[str, PartialFlow] = {}
        candidate = dict(self.by_path)
        for key in keys:
            seen = _signature(key)  # taken before the read: a later edit shows as stale
            if seen is None:
                candidate.pop(key, None)
                self._seen.pop(key, None)
                continue
            self._seen[key] = seen
            try:
                flow = load_flow(key)
            except FlowErrors as exc:
                compile_errors[key] = exc.errors
                if exc.partial is not None:
                    partials[key] = exc.partial
                continue
            refused = self._check(flow) if self._check is not None else []
            if refused:
                compile_errors[key] = refused
            else:
                fresh[key] = flow
        candidate.update(fresh)
        while True:
            cross = self._cross(candidate)
            rejected = [k for k in cross if k in fresh and candidate.get(k) is fresh[k]]
            if not rejected:
                break
            for key in rejected:
                compile_errors[key] = cross[key]
                if key in self.by_path:
                    candidate[key] = self.by_path[key]
                else:
                    candidate.pop(key)
        for key, part in partials.items():  # a broken file's other mistakes, in one report
            more = self._cross_of(part, candidate)
            compile_errors[key] = _by_position(compile_errors[key] + more)
        previous_cross = self._cross_errors
        for key in keys:
            self._compile_errors.pop(key, None)
        self._compile_errors.update(compile_errors)
        self._cross_errors = {k: v for k, v in cross.items() if k not in compile_errors}
        self.by_path = candidate
        self.flows = {flow.name: flow for flow in candidate.values()}
        self.errors = {}
        for source in (self._cross_errors, self._compile_errors):
            for key, errs in source.items():
                self.errors.setdefault(key, []).extend(errs)
        out = [e for key in keys for e in compile_errors.get(key, [])]
        for key, errs in self._cross_errors.items():
            if key in keys or [str(e) for e in errs] != [
                str(e) for e in previous_cross.get(key, [])
            ]:
                out.extend(errs)
        return out

    def stale(self) -> list[str]:
        """Paths (``str(folder / name)``, sorted) of the flow files created, changed or
        deleted since this registry last read them, by ``(mtime_ns, size, inode)``: what
        a file watcher started after :meth:`load_all` would have missed."""
        keys = {str(p) for p in self.files()} | set(self._seen)
        return sorted(k for k in keys if _signature(k) != self._seen.get(k))

    def _cross(
        self,
        candidate: dict[str, CompiledFlow],
        quiet: Callable[[CompiledFlow, tuple[str | int, ...]], bool] | None = None,
    ) -> dict[str, list[FlowError]]:
        """Cross-flow problems of the candidate set, by file path; ``quiet(flow, loc)``
        true leaves out a problem at ``loc`` of ``flow`` (a part of a broken file)."""
        problems: dict[str, list[FlowError]] = {}

        def err(flow: CompiledFlow, message: str, loc: tuple[str | int, ...]) -> None:
            if quiet is not None and quiet(flow, loc):
                return
            line, col = flow.spec.position(loc) if flow.spec else (1, 1)
            problems.setdefault(flow.path, []).append(FlowError(message, flow.path, line, col))

        owners: dict[str, list[str]] = {}
        for key, flow in candidate.items():
            owners.setdefault(flow.name, []).append(key)
        for name, keys in owners.items():
            if len(keys) < 2:
                continue
            # the version that was already loaded wins; otherwise the first file by name
            keys.sort(key=lambda k: (candidate[k] is not self.by_path.get(k), k))
            for key in keys[1:]:
                flow = candidate[key]
                declared = flow.spec is not None and "flow" in flow.spec.model_fields_set
                err(
                    flow,
                    f"flow '{name}' is already defined in {Path(keys[0]).name}",
                    ("flow",) if declared else (),
                )
        names = {flow.name: flow for flow in candidate.values()}
        for flow, message, loc in pool_problems(list(candidate.values())):
            err(flow, message, loc)
        for flow, message, loc in webhook_problems(candidate.values()):
            err(flow, message, loc)
        for flow in candidate.values():
            for i, rule in enumerate(flow.rules):
                action = rule.action
                if action == "start":
                    if rule.start not in names:
                        err(flow, self._unknown(rule.start, names), ("rules", i, "start"))
                    continue
                if action in DELIVERED:
                    continue  # reaches people, not instances
                sel = getattr(rule, action)
                if sel.flow is None or sel.flow == flow.name:
                    continue  # checked by the compiler
                other = names.get(sel.flow)
                if other is None:
                    err(flow, self._unknown(sel.flow, names), ("rules", i, action, "flow"))
                    continue
                if sel.state is not None and sel.state not in other.states:
                    hint = did_you_mean(sel.state, other.states)
                    err(
                        flow,
                        f"flow '{other.name}' has no state '{sel.state}'{hint}",
                        ("rules", i, action, "state"),
                    )
                elif action == "send":
                    pool = [sel.state] if sel.state else list(other.states)
                    events = sorted({ev for s in pool for ev in other.states[s].on})
                    if sel.event not in events:
                        err(
                            flow,
                            f"no state of flow '{other.name}' accepts event '{sel.event}'"
                            f"{did_you_mean(sel.event, events)} (events: "
                            f"{', '.join(events) or 'none'})",
                            ("rules", i, "send", "event"),
                        )
        return problems

    def check_alone(
        self, flow: CompiledFlow | PartialFlow, *others: FlowRegistry
    ) -> list[FlowError]:
        """Cross-flow problems of ``flow`` (one file checked on its own, ``flowrun check
        FILE``; a ``PartialFlow`` for a file with errors) against the flows of this folder
        and of ``others`` (loaded registries).

        The file's own loaded version, if any, is replaced by ``flow``; problems of the
        other files are not reported. Returns the ``FlowError`` list (empty when clean).
        """
        candidate: dict[str, CompiledFlow] = {}
        for reg in (*others, self):
            candidate.update(reg.by_path)
        if isinstance(flow, PartialFlow):
            return self._cross_of(flow, candidate)
        target = Path(flow.path).resolve()
        candidate = {k: v for k, v in candidate.items() if Path(k).resolve() != target}
        candidate[flow.path] = flow
        return self._cross(candidate).get(flow.path, [])

    def _cross_of(self, part: PartialFlow, candidate: dict[str, CompiledFlow]) -> list[FlowError]:
        """The cross-flow problems of a broken file's parts that validated (``part``)
        against ``candidate`` (path -> flow; the file's own entry is replaced), leaving
        out those its left-out parts could cause (``LeftOut.hides``)."""
        flow = part.flow
        target = Path(flow.path).resolve()
        others = {k: v for k, v in candidate.items() if Path(k).resolve() != target}
        found = self._cross(
            {**others, flow.path: flow}, lambda f, loc: f is flow and part.left.hides(loc)
        )
        return found.get(flow.path, [])

    @staticmethod
    def _unknown(name: str | None, names: dict[str, CompiledFlow]) -> str:
        known = ", ".join(sorted(names)) or "none"
        return f"unknown flow '{name}'{did_you_mean(str(name), names)} (known: {known})"


def _by_position(errors: list[FlowError]) -> list[FlowError]:
    return sorted(errors, key=lambda e: (e.line or 0, e.col or 0))


def _signature(path: str) -> tuple[int, int, int] | None:
    """``(st_mtime_ns, st_size, st_ino)`` of a regular file; ``None`` if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino) if stat.S_ISREG(st.st_mode) else None
