"""docs/flows.md, the flow author's reference, cannot drift from the pydantic models: its
key tables are generated from them (``runner.flowspec.reference``) and must be current."""

from __future__ import annotations

import re

import pytest

from runner.flowspec import reference, spec_sensors
from runner.lifecycle import OUTCOMES


def page() -> str:
    return reference.DOC_PATH.read_text(encoding="utf-8")


def test_page_is_current() -> None:
    text = page()
    assert text == reference.update(text), "run: python -m runner.flowspec.reference"


@pytest.mark.parametrize("name,model", [(n, m) for n, m, _ in reference.MODELS])
def test_every_model_field_is_in_its_section(name: str, model) -> None:
    block = re.search(rf"<!-- generated: {name} -->\n(.*?)<!-- end: {name} -->", page(), re.S)
    assert block is not None, f"docs/flows.md has no '{name}' table"
    keys = re.findall(r"^\| `([^`]+)` \|", block.group(1), re.M)
    assert keys == [f.alias or n for n, f in model.model_fields.items()]


def test_a_missing_field_is_caught() -> None:
    text = page()
    broken = text.replace(next(ln for ln in text.splitlines() if ln.startswith("| `from`")), "")
    assert reference.update(broken) != broken
    with pytest.raises(ValueError, match="lacks generated blocks: tail"):
        reference.update(
            re.sub(r"<!-- generated: tail -->.*?<!-- end: tail -->", "", text, flags=re.S)
        )


def test_event_fields_outcomes_defaults_and_limits_link() -> None:
    text = page()
    for kind, fields in spec_sensors.EVENT_FIELDS.items():
        assert all(f"`{f}`" in text for f in fields), kind
    assert all(f"`{o}`" in text for o in OUTCOMES)
    assert "| `try_interval` | duration | 30s |" in text  # defaults with their units
    assert "| `window` | duration | 4h |" in text
    assert "(limits.md)" in text
