"""Pydantic models of the flow file (format version 1) and the position-keeping loader.

The models mirror the YAML exactly (``extra="forbid"``); YAML keys that are awkward in
Python are aliases: ``exec`` → ``StateSpec.exec_``, ``next`` → ``StateSpec.next_``,
``on`` → ``StateSpec.on_``. Every duration is stored as float seconds.
``load_flow_text`` parses with ruamel.yaml (round trip, so positions are kept) and
raises ``FlowErrors`` naming ``file:line:col`` (1-based) for every problem found.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from croniter import croniter
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from runner.durations import parse_duration
from runner.templating import placeholders

NAME_RE = r"^[a-z_][a-z0-9_]*$"
IDENT_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
CALL_RE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"

_DURATION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": r"^\s*((\d+(\.\d+)?|\.\d+)\s*(ms|s|m|h|d)\s*)+$"},
        {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?|\.\d+)\s*$"},
        {"type": "number", "minimum": 0},
    ],
    "description": "a duration: 250ms, 30s, 5m, 4h, 2d (or a number of seconds)",
}


def _duration(value: Any) -> float:
    return parse_duration(value)


def _opt_duration(value: Any) -> float | None:
    return None if value is None else parse_duration(value)


Duration = Annotated[float, BeforeValidator(_duration), WithJsonSchema(_DURATION_SCHEMA)]
"""Seconds; accepts ``"250ms"``/``"30s"``/``"5m"``/``"4h"``/``"2d"`` or a number."""

OptDuration = Annotated[
    float | None,
    BeforeValidator(_opt_duration),
    WithJsonSchema({"anyOf": [*_DURATION_SCHEMA["anyOf"], {"type": "null"}]}),
]
"""Seconds or ``None`` (no limit)."""

StateName = Annotated[str, Field(pattern=IDENT_RE)]
Name = Annotated[str, Field(pattern=NAME_RE)]


def check_regex(value: str) -> str:
    """Return ``value`` if it compiles as a Python regex, else raise ``ValueError``."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regex {value!r}: {exc}") from None
    return value


def _check_exec_arg(value: str) -> str:
    for path in placeholders(value):
        if path.split(".")[0] not in ("data", "event"):
            raise ValueError(
                f"placeholder {{{path}}} is not allowed (expected {{data.…}} or {{event.…}})"
            )
    return value


def _check_event_template(value: str) -> str:
    for path in placeholders(value):
        if path.split(".")[0] != "event":
            raise ValueError(f"placeholder {{{path}}} is not allowed here (expected {{event.…}})")
    return value


Regex = Annotated[str, AfterValidator(check_regex)]
"""A Python regular expression (checked at load time)."""
ExecArg = Annotated[str, AfterValidator(_check_exec_arg)]
EventTemplate = Annotated[str, AfterValidator(_check_event_template)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBudgetSpec(_Strict):
    """At most ``max_errors`` errors within ``window`` seconds, then ``on_exhausted``."""

    max_errors: int = Field(8, ge=1, description="errors allowed within the window")
    window: Duration = Field(4 * 3600.0, description="sliding window (seconds)")
    on_exhausted: str = Field(
        "failed", description="what happens when the budget is spent: failed, paused or a state"
    )


class BackoffSpec(_Strict):
    """Delay after an error: ``initial * factor**(n-1)`` seconds, capped at ``max``, jittered."""

    initial: Duration = Field(10.0, description="first delay (seconds)")
    factor: float = Field(2.0, ge=1.0, description="multiplier per consecutive error")
    max: Duration = Field(600.0, description="largest delay (seconds)")
    jitter: Literal["full", "equal", "none"] = "full"


class Defaults(_Strict):
    """Policy applied to every state unless the state overrides a key."""

    try_interval: Duration = Field(30.0, description="delay before retrying a 'not yet'")
    timeout: OptDuration = Field(300.0, description="hard limit of one attempt (null: none)")
    keepalive: OptDuration = Field(None, description="handler must signal within this")
    error_budget: ErrorBudgetSpec = Field(default_factory=ErrorBudgetSpec)
    backoff: BackoffSpec = Field(default_factory=BackoffSpec)
    max_restarts: int = Field(5, ge=0, description="lost attempts allowed in one state")


POLICY_KEYS = tuple(Defaults.model_fields)
"""Keys of ``Defaults`` that a state may override."""


def _argv(value: Any) -> Any:
    if isinstance(value, str):
        raise ValueError(
            "exec takes an argv list such as [python, -m, module, '{data.path}'], never a "
            "shell string"
        )
    if isinstance(value, list):
        if not value:
            raise ValueError("exec needs at least the program name, e.g. [python, script.py]")
        return [
            str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value
        ]
    return value


def _arg(value: Any) -> Any:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _listify(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class StateSpec(_Strict):
    """One state. Exactly one of ``exec_``/``call`` (a handler), ``external`` or ``terminal``.

    Policy keys (``try_interval``, ``timeout``, ...) are ``None``/unset unless given; use
    ``model_fields_set`` to tell an explicit ``timeout: null`` from an absent one.
    """

    exec_: Annotated[list[ExecArg] | None, BeforeValidator(_argv)] = Field(
        None, alias="exec", description="argv of a program to run (no shell)"
    )
    call: str | None = Field(None, pattern=CALL_RE, description="module:function to call")
    next_: StateName | None = Field(None, alias="next", description="state after success")
    to: Annotated[list[StateName], BeforeValidator(_listify)] = Field(
        default_factory=list, description="states the handler may choose"
    )
    external: bool = Field(False, description="no handler: moved by events only")
    on_: dict[Annotated[str, Field(pattern=IDENT_RE)], StateName] = Field(
        default_factory=dict, alias="on", description="event -> target state"
    )
    terminal: bool = False
    description: str | None = None
    try_interval: OptDuration = None
    timeout: OptDuration = None
    keepalive: OptDuration = None
    error_budget: ErrorBudgetSpec | None = None
    backoff: BackoffSpec | None = None
    max_restarts: int | None = Field(None, ge=0)


class FilesSpec(_Strict):
    """Watch a folder for new files (``path`` relative to the flow file's folder)."""

    path: str
    glob: str = "*"
    recursive: bool = False
    settle: Duration = Field(0.2, description="size must be stable this long (seconds)")
    force_polling: bool = False


class TailSpec(_Strict):
    """Follow a log file; each line matching ``match`` (named groups → fields) is an event."""

    path: str
    match: Regex | None = Field(None, description="regex; named groups become event fields")


def _check_cron(value: str | None) -> str | None:
    if value is not None and not croniter.is_valid(value):
        raise ValueError(f"invalid cron expression {value!r} (expected e.g. '0 3 * * *')")
    return value


class SensorSpec(_Strict):
    """A sensor: exactly one of ``files``, ``tail``, ``every`` (seconds) or ``cron``."""

    files: FilesSpec | None = None
    tail: TailSpec | None = None
    every: OptDuration = None
    cron: str | None = None
    description: str | None = None

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        return _check_cron(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> SensorSpec:
        kinds = [k for k in ("files", "tail", "every", "cron") if getattr(self, k) is not None]
        if len(kinds) != 1:
            got = ", ".join(kinds) or "none"
            raise ValueError(f"a sensor needs exactly one of files, tail, every, cron (got: {got})")
        return self

    @property
    def kind(self) -> str:
        """``"files"``, ``"tail"``, ``"every"`` or ``"cron"``."""
        return next(k for k in ("files", "tail", "every", "cron") if getattr(self, k) is not None)


class SelectorSpec(_Strict):
    """Selects instances: by ``flow`` (default: the rule's own flow), ``state`` and data regexes."""

    flow: Name | None = None
    state: StateName | None = None
    data: dict[str, Regex] | None = Field(None, description="data field -> regex")


class SendSpec(SelectorSpec):
    """Send event ``event`` (an ``on:`` name) to the selected instances."""

    event: Annotated[str, Field(pattern=IDENT_RE)]


ACTIONS = ("start", "send", "pause", "resume", "kill")


class RuleSpec(_Strict):
    """``when`` a sensor emits an event matching ``match``, do exactly one action."""

    when: str = Field(description="a sensor name of this flow")
    match: dict[str, Regex] | None = Field(None, description="event field -> regex")
    start: Name | None = Field(None, description="start an instance of this flow")
    data: dict[str, EventTemplate] | None = Field(
        None, description="with start: data field -> template such as '{event.path}'"
    )
    send: SendSpec | None = None
    pause: SelectorSpec | None = None
    resume: SelectorSpec | None = None
    kill: SelectorSpec | None = None
    description: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _empty_selectors(cls, value: Any) -> Any:
        # ``pause:`` with nothing after it means "the rule's own flow": same as ``{}``.
        if isinstance(value, dict):
            for key in ("pause", "resume", "kill"):
                if key in value and value[key] is None:
                    value = {**value, key: {}}
        return value

    @model_validator(mode="after")
    def _one_action(self) -> RuleSpec:
        actions = [a for a in ACTIONS if getattr(self, a) is not None]
        if len(actions) != 1:
            got = ", ".join(actions) or "none"
            raise ValueError(f"a rule needs exactly one of {', '.join(ACTIONS)} (got: {got})")
        if self.data is not None and self.start is None:
            raise ValueError("data: applies to start: only")
        return self

    @property
    def action(self) -> str:
        """The action name: ``"start"``, ``"send"``, ``"pause"``, ``"resume"`` or ``"kill"``."""
        return next(a for a in ACTIONS if getattr(self, a) is not None)


class FlowSpec(_Strict):
    """One flow file. ``flow`` defaults to the file's stem (set by ``load_flow_text``)."""

    model_config = ConfigDict(
        extra="forbid",
        title="flowrun flow",
        json_schema_extra={"description": "One flowrun flow file (format version 1)."},
    )

    flow: Name | None = Field(None, description="flow name; defaults to the file's stem")
    description: str | None = None
    initial: StateName = Field(description="the state new instances start in")
    data: dict[str, Any] = Field(default_factory=dict, description="default instance data")
    defaults: Defaults = Field(default_factory=Defaults)
    states: dict[StateName, StateSpec] = Field(min_length=1)
    sensors: dict[Name, SensorSpec] = Field(default_factory=dict)
    rules: list[RuleSpec] = Field(default_factory=list)

    _positions: Any = PrivateAttr(default=None)
    _path: str = PrivateAttr(default="")

    @property
    def name(self) -> str:
        """The flow name (``flow``, else the file stem)."""
        return self.flow or Path(self._path).stem

    @property
    def path(self) -> str:
        """The flow file path given to ``load_flow_text``."""
        return self._path

    def position(self, loc: tuple, *, key: bool = False) -> tuple[int | None, int | None]:
        """1-based ``(line, col)`` of the node at ``loc`` (YAML key names, list indexes).

        Args:
            loc: e.g. ``("states", "validate", "next")`` or ``("rules", 0, "when")``.
            key: the position of the mapping key rather than of its value.
        Returns ``(None, None)`` when unknown (e.g. a spec built without a file).
        """
        if self._positions is None:
            return (None, None)
        return self._positions.find(loc, key=key)


# --------------------------------------------------------------------------- loading

_Pos = tuple[int, int]


class Positions:
    """1-based positions of every key and value of a loaded flow file, by location tuple."""

    def __init__(self) -> None:
        self.nodes: dict[tuple, tuple[_Pos, _Pos, bool]] = {(): ((1, 1), (1, 1), True)}

    def add(self, loc: tuple, key: _Pos, value: _Pos, container: bool) -> None:
        """Record the key and value positions of the node at ``loc``."""
        self.nodes[loc] = (key, value, container)

    def find(self, loc: tuple, *, key: bool | None = False) -> tuple[int, int]:
        """Position of the deepest known node on ``loc``.

        Args:
            loc: location tuple (YAML keys and list indexes).
            key: True for the key's position, False for the value's, None for "the key
                when the node is a mapping or list, else the value".
        """
        loc = tuple(loc)
        while loc not in self.nodes:
            loc = loc[:-1]
        key_pos, value_pos, container = self.nodes[loc]
        if key is None:
            key = container
        return key_pos if key else value_pos


def _mark(mark: Any) -> _Pos:
    return (mark.line + 1, mark.column + 1)


def _tag(tag: Any) -> str:
    text = str(getattr(tag, "value", tag))
    return "!!" + text[len("tag:yaml.org,2002:") :] if text.startswith("tag:yaml.org,") else text


def _scan_events(text: str, file: str, errors: list) -> None:
    """Report explicit tags and duplicate keys from the YAML event stream."""
    from ruamel.yaml import YAML
    from ruamel.yaml.events import (
        AliasEvent,
        CollectionEndEvent,
        MappingStartEvent,
        ScalarEvent,
        SequenceStartEvent,
    )

    from runner.errors import FlowError

    stack: list[list] = []  # [kind, {key: first position}, next node is a key]
    for ev in YAML(typ="rt").parse(text):
        if isinstance(ev, ScalarEvent | MappingStartEvent | SequenceStartEvent | AliasEvent):
            tag = getattr(ev, "tag", None)
            if tag is not None and not isinstance(ev, AliasEvent):
                line, col = _mark(ev.start_mark)
                errors.append(
                    FlowError(
                        f"YAML tag {_tag(tag)} is not allowed (flow files are plain data: no tags)",
                        file,
                        line,
                        col,
                    )
                )
            if stack and stack[-1][0] == "map":
                top = stack[-1]
                if top[2] and isinstance(ev, ScalarEvent) and ev.value != "<<":
                    if ev.value in top[1]:
                        line, col = _mark(ev.start_mark)
                        first = top[1][ev.value]
                        errors.append(
                            FlowError(
                                f"duplicate key '{ev.value}' (first defined at line {first})",
                                file,
                                line,
                                col,
                            )
                        )
                    else:
                        top[1][ev.value] = ev.start_mark.line + 1
                top[2] = not top[2]
            if isinstance(ev, MappingStartEvent):
                stack.append(["map", {}, True])
            elif isinstance(ev, SequenceStartEvent):
                stack.append(["seq", {}, False])
        elif isinstance(ev, CollectionEndEvent):
            stack.pop()


def _plain(node: Any, loc: tuple, pos: Positions, file: str, errors: list) -> Any:
    """Convert ruamel round-trip objects to plain Python, recording positions."""
    import datetime as dt

    from runner.errors import FlowError

    if isinstance(node, dict):
        out: dict[str, Any] = {}
        lc = getattr(node, "lc", None)
        for k, v in node.items():
            try:
                kl, kc = lc.key(k)
                vl, vc = lc.value(k)
                kpos, vpos = (kl + 1, kc + 1), (vl + 1, vc + 1)
            except Exception:  # merged keys and the like: use the mapping's position
                kpos = vpos = pos.find(loc, key=False)
            if not isinstance(k, str):
                errors.append(FlowError(f"keys must be strings, got {k!r}", file, *kpos))
                continue
            key = str(k)
            pos.add((*loc, key), kpos, vpos, isinstance(v, dict | list))
            out[key] = _plain(v, (*loc, key), pos, file, errors)
        return out
    if isinstance(node, list):
        items = []
        lc = getattr(node, "lc", None)
        for i, v in enumerate(node):
            try:
                line, col = lc.item(i)
                ipos = (line + 1, col + 1)
            except Exception:
                ipos = pos.find(loc, key=False)
            pos.add((*loc, i), ipos, ipos, isinstance(v, dict | list))
            items.append(_plain(v, (*loc, i), pos, file, errors))
        return items
    if node is None or isinstance(node, bool):
        return node
    if isinstance(node, str):
        return str(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, dt.date):
        return node.isoformat()
    value = getattr(node, "value", None)  # TaggedScalar (already reported as a tag error)
    return str(value if value is not None else node)


def _unwrap(tp: Any) -> Any:
    import types
    import typing

    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else tp
            if len(args) != 1:
                return tp
        else:
            return tp


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at ``loc`` (or None)."""
    import typing

    tp: Any = FlowSpec
    for seg in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = next(
                (f for n, f in tp.model_fields.items() if (f.alias or n) == seg),
                None,
            )
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def expected_keys(model: type[BaseModel]) -> list[str]:
    """The YAML key names a model accepts."""
    return [f.alias or n for n, f in model.model_fields.items()]


def did_you_mean(word: str, choices: Any) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _describe(err: dict, loc: tuple) -> tuple[str, bool | None]:
    """Message for one pydantic error, and which position to use (key/value/auto)."""
    typ = err["type"]
    where = ".".join(str(s) for s in loc)
    if typ == "extra_forbidden":
        model = _model_at(loc[:-1])
        name = str(loc[-1])
        if model is None:
            return f"unknown key '{name}'", True
        keys = expected_keys(model)
        hint = did_you_mean(name, keys)
        return f"unknown key '{name}'{hint} (expected one of: {', '.join(keys)})", True
    if typ == "missing":
        return f"missing required key '{loc[-1]}'" + (
            f" in {where.rsplit('.', 1)[0]}" if len(loc) > 1 else ""
        ), None
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if typ == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        msg = f"{err['input']!r} does not match {pattern}"
    return (f"{where}: {msg}" if where else msg), None


def load_flow_text(text: str, path: str | Path) -> FlowSpec:
    """Parse and validate one flow file.

    Args:
        text: the YAML source.
        path: the file path (for messages, and the default flow name = its stem).

    Returns:
        The validated ``FlowSpec`` (``flow`` filled in from the stem when absent), with
        positions available through ``FlowSpec.position``.

    Raises:
        FlowErrors: every problem found (syntax, tags, duplicate keys, unknown keys,
            wrong types, bad durations/regexes/cron...), each with ``file:line:col``.
    """
    from pydantic import ValidationError
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError

    from runner.errors import FlowError, FlowErrors

    file = str(path)
    errors: list[FlowError] = []
    try:
        _scan_events(text, file, errors)
        yaml = YAML(typ="rt")
        yaml.allow_duplicate_keys = True
        doc = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _mark(mark) if mark else (None, None)
        problem = exc.problem or exc.context or "invalid YAML"
        errors.append(FlowError(f"YAML syntax error: {problem}", file, line, col))
        raise FlowErrors(errors) from None
    except Exception as exc:  # the constructor choking on something odd
        if not errors:
            errors.append(FlowError(f"cannot read YAML: {exc}", file, 1, 1))
        raise FlowErrors(errors) from None
    if doc is None:
        errors.append(
            FlowError("empty flow file (expected a mapping with initial: and states:)", file, 1, 1)
        )
        raise FlowErrors(errors)
    if not isinstance(doc, dict):
        errors.append(
            FlowError("a flow file must be a mapping (keys initial:, states:, ...)", file, 1, 1)
        )
        raise FlowErrors(errors)
    positions = Positions()
    data = _plain(doc, (), positions, file, errors)
    spec: FlowSpec | None = None
    try:
        spec = FlowSpec.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            if "[key]" in loc:
                loc = loc[: loc.index("[key]")]
                line, col = positions.find(loc, key=True)
                name = loc[-1] if loc else ""
                msg = f"invalid name '{name}': expected letters, digits and _ (no leading digit)"
                if len(loc) > 1 and loc[-2] in ("sensors",):
                    msg = f"invalid name '{name}': expected [a-z_][a-z0-9_]*"
                errors.append(FlowError(msg, file, line, col))
                continue
            real = loc
            while real not in positions.nodes and err["type"] not in ("missing", "extra_forbidden"):
                real = real[:-1]
            message, key = _describe(err, real)
            if err["type"] == "missing":
                line, col = positions.find(real[:-1], key=True)
            else:
                line, col = positions.find(real, key=key)
            errors.append(FlowError(message, file, line, col))
    if spec is not None and spec.flow is None:
        stem = Path(file).stem
        if re.match(NAME_RE, stem):
            spec.flow = stem
        else:
            errors.append(
                FlowError(
                    f"the flow name defaults to the file name '{stem}', which is not a valid "
                    "flow name ([a-z_][a-z0-9_]*): rename the file or set flow:",
                    file,
                    1,
                    1,
                )
            )
    if errors:
        errors.sort(key=lambda e: (e.line or 0, e.col or 0))
        raise FlowErrors(errors)
    assert spec is not None
    spec._positions = positions
    spec._path = file
    return spec
