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


def _check_label(value: str) -> str:
    for path in placeholders(value):
        if path.split(".")[0] != "data":
            raise ValueError(
                f"placeholder {{{path}}} is not allowed in a label (expected {{data.…}})"
            )
    return value


Regex = Annotated[str, AfterValidator(check_regex)]
"""A Python regular expression (checked at load time)."""
ExecArg = Annotated[str, AfterValidator(_check_exec_arg)]
EventTemplate = Annotated[str, AfterValidator(_check_event_template)]
LabelTemplate = Annotated[str, AfterValidator(_check_label)]


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
    jitter: Literal["full", "equal", "none"] = Field(
        "full", description="randomise each delay: full (0..delay), equal (delay/2..delay), none"
    )


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
    terminal: bool = Field(False, description="the flow ends here (instance completed)")
    description: str | None = Field(None, description="free text, shown by the console")
    try_interval: OptDuration = Field(None, description="overrides defaults.try_interval")
    timeout: OptDuration = Field(None, description="overrides defaults.timeout")
    keepalive: OptDuration = Field(None, description="overrides defaults.keepalive")
    error_budget: ErrorBudgetSpec | None = Field(
        None, description="overrides defaults.error_budget (key by key)"
    )
    backoff: BackoffSpec | None = Field(None, description="overrides defaults.backoff")
    max_restarts: int | None = Field(None, ge=0, description="overrides defaults.max_restarts")


class FilesSpec(_Strict):
    """Watch a folder for new files (``path`` relative to the flow file's folder).

    A file counts once per path and inode: touching or rewriting a file already handled
    starts nothing, unless ``modified: true`` (then each settled change of its size or
    modification time is a new event).
    """

    path: str = Field(description="folder to watch, relative to the flow file's folder")
    glob: str = Field("*", description="file name pattern (fnmatch; with '/' the relative path)")
    recursive: bool = Field(False, description="also watch sub-folders")
    settle: Duration = Field(0.2, description="size must be stable this long (seconds)")
    force_polling: bool = Field(False, description="poll instead of OS file events")
    modified: bool = Field(
        False, description="a changed file (new size or mtime) counts again (default: once)"
    )


class TailSpec(_Strict):
    """Follow a log file; each line matching ``match`` (named groups → fields) is an event.

    ``from`` says where a file first seen by a new sensor is read from: ``end`` (only
    lines written from now on, like ``tail -f``) or ``start`` (the whole file). A sensor
    that has already read the file resumes where it stopped, and a rotated successor is
    always read from its start.
    """

    path: str = Field(description="the log file, relative to the flow file's folder")
    match: Regex | None = Field(None, description="regex; named groups become event fields")
    from_: Literal["end", "start"] = Field(
        "end", alias="from", description="where a new sensor starts reading: end or start"
    )


def _check_cron(value: str | None) -> str | None:
    if value is not None and not croniter.is_valid(value):
        raise ValueError(f"invalid cron expression {value!r} (expected e.g. '0 3 * * *')")
    return value


class SensorSpec(_Strict):
    """A sensor: exactly one of ``files``, ``tail``, ``every`` (seconds) or ``cron``."""

    files: FilesSpec | None = Field(None, description="new files in a folder")
    tail: TailSpec | None = Field(None, description="lines appended to a log file")
    every: OptDuration = Field(None, description="a tick every this long (seconds)")
    cron: str | None = Field(
        None, description="a tick at each time of this cron expression (host's local time)"
    )
    description: str | None = Field(None, description="free text")

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


#: The fields of each sensor kind's events (the payload keys the sensors in
#: ``runner.sensors`` write; a test runs every sensor and compares). A ``tail`` event also
#: has one field per named group of its ``match`` regex (:func:`event_fields`).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "files": ("path", "name", "size"),
    "tail": ("line", "file"),
    "every": ("tick", "scheduled", "missed"),
    "cron": ("tick", "scheduled", "missed"),
}


def event_fields(sensor: SensorSpec) -> list[str]:
    """The field names of ``sensor``'s events: :data:`EVENT_FIELDS` of its kind, plus a
    ``tail`` regex's named groups (first)."""
    fields = list(EVENT_FIELDS[sensor.kind])
    if sensor.tail is not None and sensor.tail.match:
        groups = list(re.compile(sensor.tail.match).groupindex)
        fields = [*groups, *(f for f in fields if f not in groups)]
    return fields


class SelectorSpec(_Strict):
    """Selects instances: by ``flow`` (default: the rule's own flow), ``state`` and data regexes."""

    flow: Name | None = Field(None, description="instances of this flow (default: the rule's)")
    state: StateName | None = Field(None, description="only instances in this state")
    data: dict[str, Regex] | None = Field(
        None, description="data field -> regex (re.search); {event.x} matches literally"
    )


class SendSpec(SelectorSpec):
    """Send event ``event`` (an ``on:`` name) to the selected instances."""

    event: Annotated[str, Field(pattern=IDENT_RE)] = Field(
        description="an event name of the target states' on:"
    )


ACTIONS = ("start", "send", "pause", "resume", "kill")


class RuleSpec(_Strict):
    """``when`` a sensor emits an event matching ``match``, do exactly one action."""

    when: str = Field(description="a sensor name of this flow")
    match: dict[str, Regex] | None = Field(None, description="event field -> regex")
    start: Name | None = Field(None, description="start an instance of this flow")
    data: dict[str, EventTemplate] | None = Field(
        None, description="with start: data field -> template such as '{event.path}'"
    )
    send: SendSpec | None = Field(None, description="send an event to the selected instances")
    pause: SelectorSpec | None = Field(None, description="pause the selected instances")
    resume: SelectorSpec | None = Field(None, description="resume the selected instances")
    kill: SelectorSpec | None = Field(None, description="kill the selected instances")
    description: str | None = Field(None, description="free text")

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
    description: str | None = Field(None, description="free text, shown by the console")
    label: LabelTemplate | None = Field(
        None,
        description="short text naming each instance, e.g. '{data.path}' (paths shortened)",
    )
    initial: StateName = Field(description="the state new instances start in")
    data: dict[str, Any] = Field(default_factory=dict, description="default instance data")
    defaults: Defaults = Field(
        default_factory=Defaults, description="policy of every state unless it overrides a key"
    )
    states: dict[StateName, StateSpec] = Field(min_length=1, description="state name -> state")
    sensors: dict[Name, SensorSpec] = Field(
        default_factory=dict, description="sensor name -> sensor"
    )
    rules: list[RuleSpec] = Field(default_factory=list, description="what events do")

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
