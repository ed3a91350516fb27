"""JSON Schema of the flow file, generated from the pydantic models in ``runner.flowspec.spec``.

``python -m runner.flowspec.schema`` rewrites ``schemas/flow.schema.json``; a test keeps the
shipped file equal to :func:`render`. Editors use it through the first line of a flow
file: ``# yaml-language-server: $schema=../schemas/flow.schema.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from runner.flowspec.spec import FlowSpec

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "flow.schema.json"
"""Where the generated schema is shipped."""

SCHEMA_ID = "https://flowrun.dev/schemas/flow.schema.json"


def generate() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one flow file, keyed by the YAML names (aliases)."""
    schema = FlowSpec.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "flowrun flow"
    schema["description"] = (
        "One flowrun flow file (format version 1): a named state graph with defaults, "
        "sensors and rules. Durations are strings such as 250ms, 30s, 5m, 4h, 2d, or a "
        "number of seconds."
    )
    return schema


def render() -> str:
    """The schema as stable JSON text (sorted keys, indent 2, trailing newline)."""
    return json.dumps(generate(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schema to ``argv[0]`` or ``schemas/flow.schema.json``; returns 0."""
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else SCHEMA_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
