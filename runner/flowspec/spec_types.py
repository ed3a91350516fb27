"""The field types of the flow file models: names, durations, regexes and templates.

Each is an ``Annotated`` type that validates (and converts: every duration becomes float
seconds) when a flow file is loaded, and says what it accepts in the JSON Schema; plus
:class:`Strict`, the base of every model (unknown keys are errors). The models that use
them: ``runner.flowspec.spec`` (flow, defaults, states), ``runner.flowspec.spec_sensors``
and ``runner.flowspec.spec_rules``.
"""

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from runner.durations import parse_duration
from runner.labels import KEY_RE
from runner.retention import parse_window
from runner.templating import placeholders

NAME_RE = r"^[a-z_][a-z0-9_]*$"
IDENT_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
LABEL_RE = KEY_RE  # a worker label's name
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


def _window(value: Any) -> float | str:
    if isinstance(value, str) and value.strip().lower() == "forever":
        return "forever"
    seconds = parse_window(value)
    return "forever" if seconds is None else seconds


Window = Annotated[
    float | str,
    BeforeValidator(_window),
    WithJsonSchema(
        {
            "anyOf": [*_DURATION_SCHEMA["anyOf"], {"const": "forever"}],
            "description": "how long to keep: a duration (30d, 12h) or 'forever'",
        }
    ),
]
"""A retention window: seconds, or ``"forever"``."""


def parse_rate(value: Any) -> tuple[int, float]:
    """``"10/1m"`` → ``(10, 60.0)``: at most that many starts per that many seconds.

    Raises:
        ValueError: not ``COUNT/DURATION`` with a count of 1 or more and a duration above 0.
    """
    count, sep, per = str(value).partition("/")
    try:
        n = int(count.strip())
        window = parse_duration(per.strip()) if sep else 0.0
    except ValueError:
        n, window = 0, 0.0
    if n < 1 or window <= 0:
        raise ValueError(f"a rate is COUNT/DURATION such as 10/1m or 20/10s, not {value!r}")
    return n, window


def _rate(value: Any) -> str:
    parse_rate(value)
    return str(value).strip()


Rate = Annotated[
    str,
    BeforeValidator(_rate),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^\s*\d+\s*/\s*\S+\s*$",
            "description": "at most COUNT starts per DURATION: 10/1m, 20/10s",
        }
    ),
]
"""A rate, ``"COUNT/DURATION"`` (``parse_rate`` gives ``(count, seconds)``)."""

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


def _check_runs_on(value: str) -> str:
    for path in placeholders(value):
        if path.split(".")[0] not in ("data", "event"):
            raise ValueError(
                f"placeholder {{{path}}} is not allowed in runs_on (expected {{data.…}} or "
                "{event.…})"
            )
    return value


def _check_sensor_label(value: str) -> str:
    if placeholders(value):
        raise ValueError("a sensor's runs_on takes plain values (no placeholders)")
    return value


LabelName = Annotated[str, Field(pattern=LABEL_RE, max_length=63)]
"""A worker label's name (``runner.labels.KEY_RE``)."""
RunsOn = dict[LabelName, Annotated[str, AfterValidator(_check_runs_on)]]
"""A state's ``runs_on``: label name -> value, a ``{data.…}``/``{event.…}`` template."""
SensorRunsOn = dict[LabelName, Annotated[str, AfterValidator(_check_sensor_label)]]
"""A sensor's ``runs_on``: label name -> plain value."""


Regex = Annotated[str, AfterValidator(check_regex)]
"""A Python regular expression (checked at load time)."""
ExecArg = Annotated[str, AfterValidator(_check_exec_arg)]
EventTemplate = Annotated[str, AfterValidator(_check_event_template)]
LabelTemplate = Annotated[str, AfterValidator(_check_label)]


class Strict(BaseModel):
    """Base of every flow file model: unknown keys are errors (``extra="forbid"``)."""

    model_config = ConfigDict(extra="forbid")
