"""Load a flow file: ruamel.yaml (round-trip, positions kept) into ``runner.flowspec.spec`` models.

Every problem is reported with its ``file:line:col`` (1-based): YAML syntax, duplicate
keys, tags, a bound of ``runner.flowspec.limits`` crossed (size, nesting, aliases, bytes,
time), and each pydantic error mapped back to the key or value it is about. All of a
file's errors are collected and raised together as ``FlowErrors``; a file with field
errors is validated again without them (``runner.flowspec.partial``) so the compiler can
check the rest (:func:`load_flow_partial`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
)

from runner.flowspec.limits import LimitError, check_text, guarded_yaml
from runner.flowspec.partial import LeftOut, cut_for, leave_out
from runner.flowspec.spec import FlowSpec
from runner.flowspec.spec_types import NAME_RE

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from runner.errors import FlowError

_Pos = tuple[int, int]


class Positions:
    """1-based positions of every key and value of a loaded flow file, by location tuple."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[str | int, ...], tuple[_Pos, _Pos, bool]] = {
            (): ((1, 1), (1, 1), True)
        }
        #: The nodes left out to validate a file with field errors: ``find`` takes
        #: locations in the data validated (list indexes shifted) and maps them back.
        self.left: LeftOut | None = None

    def add(self, loc: tuple[str | int, ...], key: _Pos, value: _Pos, container: bool) -> None:
        """Record the key and value positions of the node at ``loc``."""
        self.nodes[loc] = (key, value, container)

    def find(self, loc: tuple[str | int, ...], *, key: bool | None = False) -> tuple[int, int]:
        """Position of the deepest known node on ``loc``.

        Args:
            loc: location tuple (YAML keys and list indexes).
            key: True for the key's position, False for the value's, None for "the key
                when the node is a mapping or list, else the value".
        """
        loc = tuple(loc) if self.left is None else self.left.in_file(tuple(loc))
        while loc not in self.nodes:
            loc = loc[:-1]
        key_pos, value_pos, container = self.nodes[loc]
        if key is None:
            key = container
        return key_pos if key else value_pos


def _mark(mark: Any) -> _Pos:
    return (mark.line + 1, mark.column + 1)


def _plain(
    node: Any, loc: tuple[str | int, ...], pos: Positions, file: str, errors: list[FlowError]
) -> Any:
    """Convert ruamel round-trip objects to plain Python, recording positions."""
    import datetime as dt

    from runner.errors import FlowError

    if isinstance(node, dict):
        out: dict[str, Any] = {}
        lc: Any = getattr(node, "lc", None)  # ruamel's positions (None: caught below)
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
        if not math.isfinite(node) and "data" in loc:  # elsewhere the field says why
            line, col = pos.find(loc, key=False)
            errors.append(
                FlowError(
                    f"{node} is not a finite number (JSON has no NaN or Infinity)", file, line, col
                )
            )
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


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
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


def _describe(err: ErrorDetails, loc: tuple[str | int, ...]) -> tuple[str, bool | None]:
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
    from runner.errors import FlowErrors

    loaded = load_flow_partial(text, path)
    if loaded.errors:
        raise FlowErrors(loaded.errors)
    assert loaded.spec is not None
    return loaded.spec


@dataclass
class Loaded:
    """A flow file as far as it validates (:func:`load_flow_partial`).

    Attributes:
        spec: the ``FlowSpec`` (positions kept), validated without the nodes that have
            field errors (``left``); ``None`` when the file cannot be read as a flow at
            all (YAML syntax, a bound of ``runner.flowspec.limits``, a required key).
        errors: every problem found, sorted by position (``[]``: valid).
        left: the nodes left out to validate the rest (``runner.flowspec.partial``).
        data: the file's plain values (``None`` when it did not parse).
    """

    spec: FlowSpec | None
    errors: list[FlowError]
    left: LeftOut = field(default_factory=LeftOut)
    data: Any = None


#: Validations of a file without its broken parts before giving up (each leaves out more).
_ROUNDS = 6


def load_flow_partial(text: str, path: str | Path) -> Loaded:
    """Parse and validate one flow file, and when some fields are wrong, validate it
    again without them so that the rest can still be checked (a :class:`Loaded`).

    The errors are those of the file as written (field errors of the first validation
    only: what leaving parts out causes is not reported). Raises nothing of its own.
    """
    from pydantic import ValidationError
    from ruamel.yaml.error import MarkedYAMLError

    from runner.errors import FlowError

    file = str(path)
    errors: list[FlowError] = []
    try:
        check_text(text)
        doc = guarded_yaml(file, errors).load(text)
    except LimitError as exc:
        errors.append(FlowError(exc.message, file, exc.line, exc.col))
        return Loaded(None, _sorted(errors))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _mark(mark) if mark else (1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        errors.append(FlowError(f"YAML syntax error: {problem}", file, line, col))
        return Loaded(None, errors)
    except Exception as exc:  # the constructor choking on something odd
        if not errors:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            errors.append(FlowError(f"cannot read YAML: {first}", file, 1, 1))
        return Loaded(None, errors)
    if doc is None:
        errors.append(
            FlowError("empty flow file (expected a mapping with initial: and states:)", file, 1, 1)
        )
        return Loaded(None, errors)
    if not isinstance(doc, dict):
        errors.append(
            FlowError("a flow file must be a mapping (keys initial:, states:, ...)", file, 1, 1)
        )
        return Loaded(None, errors)
    positions = Positions()
    data = _plain(doc, (), positions, file, errors)
    left = LeftOut()
    positions.left = left
    spec: FlowSpec | None = None
    for round_ in range(_ROUNDS):
        try:
            spec = FlowSpec.model_validate(leave_out(data, left) if left.nodes else data)
            break
        except ValidationError as exc:
            cuts = set()
            for err in exc.errors(include_url=False):
                loc = left.in_file(tuple(err["loc"]))
                if round_ == 0:
                    errors.append(_field_error(err, loc, positions, file))
                cuts.add(cut_for(loc, err["type"], positions.nodes))
            if () in cuts or cuts <= left.nodes:
                break  # nothing left to validate, or no progress
            left.nodes |= cuts
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
    if spec is not None:
        spec._positions = positions
        spec._path = file
    return Loaded(spec, _sorted(errors), left, data)


def _sorted(errors: list[FlowError]) -> list[FlowError]:
    return sorted(errors, key=lambda e: (e.line or 0, e.col or 0))


def _field_error(
    err: ErrorDetails, loc: tuple[str | int, ...], positions: Positions, file: str
) -> FlowError:
    """The ``FlowError`` of one pydantic error at ``loc`` (a location in the file)."""
    from runner.errors import FlowError

    if "[key]" in loc:
        loc = loc[: loc.index("[key]")]
        line, col = positions.find(loc, key=True)
        name = loc[-1] if loc else ""
        msg = f"invalid name '{name}': expected letters, digits and _ (no leading digit)"
        if len(loc) > 1 and loc[-2] in ("sensors",):
            msg = f"invalid name '{name}': expected [a-z_][a-z0-9_]*"
        return FlowError(msg, file, line, col)
    real = loc
    while real not in positions.nodes and err["type"] not in ("missing", "extra_forbidden"):
        real = real[:-1]
    message, key = _describe(err, real)
    if err["type"] == "missing":
        line, col = positions.find(real[:-1], key=True)
    else:
        line, col = positions.find(real, key=key)
    return FlowError(message, file, line, col)
