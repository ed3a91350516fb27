"""The facts of a compiled flow that the read side shows (``flowrun show``/``explain``):
each state's kind, ``next``/``to``/``on``, effective policy and handler setup names, as
plain JSON, cached on disk by flow version so that a read needs neither the YAML models
(pydantic) nor the compiler.

The cache lives in ``$XDG_CACHE_HOME/flowrun/facts`` (``~/.cache/flowrun/facts``), one
file per flow version (the sha256 of its source) and per build of ``runner.flowspec``
(its files' sizes and modification times): a changed compiler never reads old facts. A
cache that cannot be read or written is skipped (the flow is compiled instead).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import IllegalMove
from runner.flowspec.deadlines import Deadline
from runner.flowspec.policy import Backoff, Policy
from runner.labels import NO_ROUTING, Routing

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

FORMAT = 2
"""Bumped when the JSON below changes shape."""


@dataclass(frozen=True)
class SetupNames:
    """The names a handler state's setup gives: environment variables and secrets."""

    env_names: tuple[str, ...]
    secret_names: tuple[str, ...]


@dataclass(frozen=True)
class StateFacts:
    """One state as the read side sees it (the fields of ``CompiledState`` it reads).

    Attributes:
        name: the state's name.
        kind: ``"exec"``, ``"call"``, ``"external"`` or ``"terminal"``.
        next: the state after success, or ``None``.
        to: the states the handler may choose.
        on: ``{event: target state}``.
        policy: the effective policy (durations in seconds).
        setup: the env and secret names its handler gets.
        routing: its ``runs_on`` and ``routing_timeout`` (``runner.labels.Routing``).
        deadline: its deadline (``runner.flowspec.deadlines``), or ``None``.
    """

    name: str
    kind: str
    next: str | None
    to: tuple[str, ...]
    on: dict[str, str]
    policy: Policy
    setup: SetupNames
    routing: Routing = NO_ROUTING
    deadline: Deadline | None = None


@dataclass(frozen=True)
class FlowFacts:
    """A flow version as the read side sees it: ``name``, ``version``, ``initial``,
    ``states`` (``{name: StateFacts}`` in file order) and the flow's ``deadline``."""

    name: str
    version: str
    initial: str
    states: dict[str, StateFacts]
    deadline: Deadline | None = None

    def event_target(self, state: str, event: str) -> str:
        """The target of ``on: {event: target}`` in ``state``.

        Raises:
            IllegalMove: ``state`` is not a state, or it does not accept ``event``.
        """
        st = self.states.get(state)
        if st is None or event not in st.on:
            raise IllegalMove(f"state '{state}' does not accept event '{event}'")
        return st.on[event]


def facts_json(flow: CompiledFlow) -> dict[str, Any]:
    """The facts of ``flow`` as a JSON-ready dict (read back by :func:`facts_from_json`)."""
    return {
        "format": FORMAT,
        "name": flow.name,
        "version": flow.version,
        "initial": flow.initial,
        "states": [
            {
                "name": st.name,
                "kind": st.kind,
                "next": st.next,
                "to": list(st.to),
                "on": dict(st.on),
                "policy": asdict(st.policy),
                "env": list(st.setup.env_names),
                "secrets": list(st.setup.secret_names),
                "routing": asdict(st.routing),
                "deadline": _deadline_json(st.deadline),
            }
            for st in flow.states.values()
        ],
        "deadline": _deadline_json(flow.deadline),
    }


def _deadline_json(d: Deadline | None) -> dict[str, Any] | None:
    return None if d is None else asdict(d)


def _deadline(data: dict[str, Any] | None) -> Deadline | None:
    return None if data is None else Deadline(**data)


def facts_from_json(data: dict[str, Any]) -> FlowFacts:
    """The ``FlowFacts`` of a :func:`facts_json` dict.

    Raises:
        KeyError, TypeError, ValueError: the dict is not of this ``FORMAT``.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("facts of another format")
    states = {}
    for s in data["states"]:
        pol = dict(s["policy"])
        pol["backoff"] = Backoff(**pol["backoff"])
        states[s["name"]] = StateFacts(
            name=s["name"],
            kind=s["kind"],
            next=s["next"],
            to=tuple(s["to"]),
            on=dict(s["on"]),
            policy=Policy(**pol),
            setup=SetupNames(tuple(s["env"]), tuple(s["secrets"])),
            routing=Routing(**s["routing"]),
            deadline=_deadline(s["deadline"]),
        )
    return FlowFacts(
        data["name"], data["version"], data["initial"], states, _deadline(data["deadline"])
    )


def _cache_file(version: str) -> Path:
    """The cache file of ``version`` for this build of ``runner.flowspec``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    here = Path(__file__).parent
    build = 0
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            st = os.stat(here / name)
            build = (build * 1_000_003 + st.st_size * 7 + st.st_mtime_ns) % (1 << 61)
    return Path(base) / "flowrun" / "facts" / f"{version}-{FORMAT}-{build:x}.json"


_memo: dict[str, FlowFacts] = {}


def cached_facts(version: str, compile_flow: Callable[[], CompiledFlow]) -> FlowFacts:
    """The ``FlowFacts`` of flow ``version``: from this process's memory, else the disk
    cache, else ``compile_flow()`` (then written to the cache, atomically).

    Raises whatever ``compile_flow`` raises (``UserError`` for a version not stored or no
    longer compiling); never an error of the cache itself.
    """
    found = _memo.get(version)
    if found is not None:
        return found
    path: Path | None = None
    try:
        path = _cache_file(version)
        found = facts_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        found = None
    if found is None or found.version != version:
        data = facts_json(compile_flow())
        found = facts_from_json(data)
        if path is not None:
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(data), encoding="utf-8")
                os.replace(tmp, path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
    _memo[version] = found
    return found
