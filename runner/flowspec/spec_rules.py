"""The ``rules:`` of a flow file: pydantic models of what a sensor's events do.

A rule (:class:`RuleSpec`) takes exactly one action (:data:`ACTIONS`): start an instance,
send an event to selected instances (:class:`SendSpec`), or pause, resume or kill them
(:class:`SelectorSpec`). The rule engine is ``runner.sensors.rules``.
"""

from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from runner.flowspec.spec_types import (
    IDENT_RE,
    EventTemplate,
    Name,
    Regex,
    StateName,
    Strict,
)


class SelectorSpec(Strict):
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


class RuleSpec(Strict):
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
    def _one_action(self) -> Self:
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
