"""The key tables of ``docs/flows.md``, generated from the pydantic models in
``runner.flowspec.spec``, ``spec_sensors`` and ``spec_rules`` so the reference cannot
drift from the code.

``docs/flows.md`` is prose around generated blocks; each block sits between
``<!-- generated: NAME -->`` and ``<!-- end: NAME -->`` lines. ``python -m
runner.flowspec.reference`` rewrites the blocks in place; a test fails when the page
differs from :func:`update` of itself (a model field added, removed or changed, an event
field or an outcome missing).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, BeforeValidator
from pydantic_core import PydanticUndefined

from runner.durations import format_duration
from runner.flowspec import spec, spec_handler, spec_rules, spec_sensors, spec_types
from runner.lifecycle import OUTCOMES

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "flows.md"
"""Where the reference page lives."""

#: ``(block name, model, YAML path shown in the heading)``, in page order.
MODELS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("flow", spec.FlowSpec, "top level"),
    ("defaults", spec.Defaults, "defaults"),
    ("error_budget", spec.ErrorBudgetSpec, "defaults.error_budget, states.S.error_budget"),
    ("backoff", spec.BackoffSpec, "defaults.backoff, states.S.backoff"),
    ("retention", spec.RetentionSpec, "retention"),
    ("deadline", spec.DeadlineSpec, "deadline, states.S.deadline"),
    ("state", spec.StateSpec, "states.S"),
    ("pools", spec.PoolSpec, "pools.P"),
    ("max_running", spec.MaxRunningSpec, "max_running"),
    (
        "routing_timeout",
        spec.RoutingTimeoutSpec,
        "defaults.routing_timeout, states.S.routing_timeout",
    ),
    ("secret", spec_handler.SecretSpec, "defaults.secrets.NAME, states.S.secrets.NAME"),
    ("working_dir", spec_handler.WorkingDirSpec, "states.S.working_dir"),
    ("limits", spec_handler.LimitsSpec, "states.S.limits"),
    ("sensor", spec_sensors.SensorSpec, "sensors.N"),
    ("files", spec_sensors.FilesSpec, "sensors.N.files"),
    ("tail", spec_sensors.TailSpec, "sensors.N.tail"),
    ("lifecycle", spec_sensors.LifecycleSpec, "sensors.N.lifecycle"),
    ("webhook_in", spec_sensors.WebhookInSpec, "sensors.N.webhook"),
    ("hmac", spec_sensors.HmacSpec, "sensors.N.webhook.hmac"),
    ("rule", spec_rules.RuleSpec, "rules[i]"),
    ("selector", spec_rules.SelectorSpec, "rules[i].pause / resume / kill"),
    ("send", spec_rules.SendSpec, "rules[i].send"),
    ("webhook", spec_rules.WebhookSpec, "rules[i].webhook"),
    ("once_per", spec_rules.OncePerSpec, "rules[i].once_per"),
    ("on_failure", spec_rules.OnFailureSpec, "on_failure"),
)

_BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end: \2 -->)", re.S)


def _is_duration(field: Any) -> bool:
    return any(
        isinstance(m, BeforeValidator)
        and m.func in (spec_types._duration, spec_types._opt_duration)
        for m in field.metadata
    )


def _schema_type(p: dict[str, Any]) -> str:
    """A short type name for one JSON Schema node: ``name``, ``state name``, ``[X]``..."""
    if "$ref" in p:
        model = p["$ref"].rsplit("/", 1)[-1]
        name = next((n for n, m, _ in MODELS if m.__name__ == model), model)
        return f"[{name}](#{name})"
    if "enum" in p:
        return " \\| ".join(str(v) for v in p["enum"])
    if "anyOf" in p:
        kinds = [_schema_type(a) for a in p["anyOf"] if a.get("type") != "null"]
        if any(a.get("pattern", "").endswith("(ms|s|m|h|d)\\s*)+$") for a in p["anyOf"]):
            kinds = ["duration"]
        nullable = any(a.get("type") == "null" for a in p["anyOf"])
        return " or ".join(dict.fromkeys(kinds)) + (" or null" if nullable else "")
    kind = p.get("type")
    if kind == "array":
        return f"list of {_schema_type(p.get('items', {}))}"
    if kind == "object":
        values = p.get("additionalProperties")
        if "patternProperties" in p:
            values = next(iter(p["patternProperties"].values()))
        if not isinstance(values, dict):
            return "map"
        return f"map of {_schema_type(values)}"
    pattern = p.get("pattern")
    if pattern == spec_types.NAME_RE:
        return "name"
    if pattern == spec_types.IDENT_RE:
        return "identifier"
    if pattern == spec_types.CALL_RE:
        return "module:function"
    names: dict[Any, str] = {"string": "text", "boolean": "true/false", "integer": "integer"}
    return names.get(kind, kind or "any")


def _type(model: type[BaseModel], key: str) -> str:
    schema = spec.FlowSpec.model_json_schema(by_alias=True, mode="validation")
    node = schema if model is spec.FlowSpec else schema["$defs"][model.__name__]
    return _schema_type(node["properties"][key])


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "{}" if isinstance(value, BaseModel | dict) else "[]"
    value = field.default
    if value is None or value is PydanticUndefined:
        return "—"
    if _is_duration(field):
        return format_duration(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def keys_table(model: type[BaseModel]) -> str:
    """The Markdown table of ``model``'s YAML keys: key, type, default, meaning."""
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        meaning = (field.description or "").replace("|", "\\|")
        lines.append(f"| `{key}` | {_type(model, key)} | {_default(field)} | {meaning} |")
    return "\n".join(lines) + "\n"


def events_table() -> str:
    """The Markdown table of each sensor kind's event fields (``spec_sensors.EVENT_FIELDS``)."""
    lines = ["| sensor kind | event fields |", "| --- | --- |"]
    for kind, fields in spec_sensors.EVENT_FIELDS.items():
        extra = " + the named groups of `match`" if kind == "tail" else ""
        lines.append(f"| `{kind}` | {', '.join(f'`{f}`' for f in fields)}{extra} |")
    return "\n".join(lines) + "\n"


def blocks() -> dict[str, str]:
    """Every generated block's text, by name."""
    out = {name: keys_table(model) for name, model, _ in MODELS}
    out["events"] = events_table()
    out["outcomes"] = ", ".join(f"`{o}`" for o in OUTCOMES) + "\n"
    return out


def update(text: str) -> str:
    """``text`` (the page) with every generated block rewritten.

    Raises:
        ValueError: a block of :func:`blocks` has no markers in ``text``.
    """
    wanted = blocks()
    found = set()

    def fill(m: re.Match[str]) -> str:
        found.add(m.group(2))
        return m.group(1) + wanted.get(m.group(2), m.group(3)) + m.group(4)

    out = _BLOCK.sub(fill, text)
    missing = sorted(set(wanted) - found)
    if missing:
        raise ValueError(f"docs/flows.md lacks generated blocks: {', '.join(missing)}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated blocks of ``argv[0]`` or ``docs/flows.md``; returns 0."""
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else DOC_PATH
    target.write_text(update(target.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"updated {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
