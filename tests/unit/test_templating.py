"""runner.templating: dotted placeholders only, literal braces, injection safety."""

from __future__ import annotations

import os

import pytest

from runner.templating import compiled, placeholders, render, render_value

CTX = {
    "data": {"path": "in/a.csv", "n": 3, "ok": True, "none": None, "nested": {"k": "v"}},
    "event": {"code": "503"},
}


def test_render_dotted_paths() -> None:
    assert render("{data.path}", CTX) == "in/a.csv"
    assert render("x={data.nested.k}-{event.code}", CTX) == "x=v-503"
    assert render("no placeholders", CTX) == "no placeholders"


def test_render_value_kinds() -> None:
    assert render("{data.n}", CTX) == "3"
    assert render("{data.ok}", CTX) == "true"
    assert render("{data.none}", CTX) == ""
    assert render("{data.nested}", CTX) == '{"k":"v"}'


def test_literal_braces() -> None:
    assert render("{{data.path}}", CTX) == "{data.path}"
    assert render("{{{data.path}}}", CTX) == "{in/a.csv}"
    assert render("}}{{", CTX) == "}{"
    assert placeholders("{{data.path}}") == []


def test_missing_path_raises_keyerror_naming_it() -> None:
    with pytest.raises(KeyError) as info:
        render("{data.nope}", CTX)
    assert info.value.args[0] == "data.nope"
    with pytest.raises(KeyError, match="data.path.deeper"):
        render("{data.path.deeper}", CTX)  # a string is not a mapping


@pytest.mark.parametrize(
    "template",
    [
        "{data[0]}",
        "{data.path!r}",
        "{data.path:>10}",
        "{data.path.__class__()}",
        "{ data }",
        "{}",
        "{0}",
        "{data",
        "data}",
        "{data.path + 1}",
        "{data..x}",
    ],
)
def test_only_dotted_paths_are_allowed(template: str) -> None:
    with pytest.raises(ValueError):
        placeholders(template)
    with pytest.raises(ValueError):
        render(template, CTX)


def test_attribute_lookups_never_happen() -> None:
    # a dunder segment is just a key: dicts have no such key, so it is missing
    with pytest.raises(KeyError):
        render("{data.__class__}", CTX)
    with pytest.raises(KeyError):
        render("{data.path.upper}", CTX)


def test_placeholders_lists_paths_in_order() -> None:
    assert placeholders("{data.a}-{event.b.c}{data.a}") == ["data.a", "event.b.c", "data.a"]


def test_injection_is_returned_verbatim(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    evil = {
        "data": {
            "path": "$(touch pwned)",
            "semi": "; touch pwned2 #",
            "fmt": "{data.path}",
            "tick": "`touch pwned3`",
        }
    }
    assert render("{data.path}", evil) == "$(touch pwned)"
    assert render("{data.semi}", evil) == "; touch pwned2 #"
    # a value that looks like a placeholder is not formatted again
    assert render("{data.fmt}", evil) == "{data.path}"
    assert render("a {data.tick} b", evil) == "a `touch pwned3` b"
    assert os.listdir(tmp_path) == []


def test_render_value_keeps_the_type_of_a_lone_placeholder() -> None:
    ctx = {"event": {"size": 4846, "tags": ["a"], "gone": None, "ok": True, "name": "x.csv"}}
    assert render_value("{event.size}", ctx) == 4846
    assert render_value("{event.tags}", ctx) == ["a"]
    assert render_value("{event.gone}", ctx) is None
    assert render_value("{event.ok}", ctx) is True
    assert render_value("{event.size} bytes", ctx) == "4846 bytes"
    assert render_value(" {event.size}", ctx) == " 4846"
    assert render_value("{{event.size}}", ctx) == "{event.size}"
    with pytest.raises(KeyError, match="event.nope"):
        render_value("{event.nope}", ctx)


def test_a_label_shortens_paths_but_not_text_that_mentions_one():
    from runner.templating import render_label

    def label(value: object) -> str | None:
        return render_label("{data.x}", {"data": {"x": value}})

    assert label("/srv/in/2024/jan.csv") == "2024/jan.csv"
    assert label("./in/a b/jan feb.csv") == "a b/jan feb.csv"
    assert label("inbox/seattle/weather.csv") == "seattle/weather.csv"
    line = "ERROR [cache] evicted [/var/lib/app]"
    assert label(line) == line
    assert label("a/b c") == "a/b c"


def test_a_compiled_template_renders_as_render_does() -> None:
    context = {"data": {"i": 3, "tags": ["a"], "on": True}}
    for template in ("gold", "eu-{data.i}", "{data.tags}/{data.on}", "{{x}}", ""):
        assert compiled(template)(context) == render(template, context)
    with pytest.raises(KeyError, match="data.gone"):
        compiled("x-{data.gone}")(context)
    with pytest.raises(ValueError):
        compiled("{data.i")
