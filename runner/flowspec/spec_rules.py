"""The ``rules:`` of a flow file: pydantic models of what a sensor's events do.

A rule (:class:`RuleSpec`) takes exactly one action (:data:`ACTIONS`): start an instance,
send an event to selected instances (:class:`SendSpec`), pause, resume or kill them
(:class:`SelectorSpec`), or reach people: run a notifier (``exec``) or send a webhook
(:class:`WebhookSpec`), delivered and retried after the event is handled. The rule engine
is ``runner.sensors.rules``.
"""

from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, model_validator

from runner.flowspec.spec_types import (
    IDENT_RE,
    Duration,
    EventTemplate,
    Name,
    Regex,
    StateName,
    Strict,
)
from runner.templating import placeholders


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


def _check_header(value: str) -> str:
    for path in placeholders(value):
        if path.split(".")[0] not in ("event", "env"):
            raise ValueError(
                f"placeholder {{{path}}} is not allowed here (expected {{event.…}} or {{env.…}})"
            )
    return value


HeaderTemplate = Annotated[str, AfterValidator(_check_header)]


class WebhookSpec(Strict):
    """An HTTP request per event: the event as a JSON body unless ``body`` is given."""

    url: EventTemplate = Field(description="http(s) URL; may name {event.x}")
    method: Literal["POST", "PUT", "PATCH", "GET"] = Field("POST", description="HTTP method")
    headers: dict[str, HeaderTemplate] = Field(
        default_factory=dict,
        description="header -> template; {env.X} reads the daemon's environment when sent "
        "(never stored)",
    )
    body: EventTemplate | None = Field(
        None, description="body template (default: the event as JSON)"
    )
    timeout: Duration = Field(10.0, description="seconds for the whole request")


class OncePerSpec(Strict):
    """At most one delivery per ``key`` per ``window``; the others are counted."""

    key: EventTemplate = Field(
        "{event.flow} {event.state} {event.kind} {event.error}",
        description="template of the folding key (default: flow, state, kind, error)",
    )
    window: Duration = Field(description="how long one delivery stands for its key")


ACTIONS = ("start", "send", "pause", "resume", "kill", "exec", "webhook")
#: The actions that reach people: delivered after the event is handled, retried.
DELIVERED = ("exec", "webhook")


class RuleSpec(Strict):
    """``when`` a sensor emits an event matching ``match``, do exactly one action."""

    when: str = Field(description="a sensor name of this flow")
    match: dict[str, Regex] | None = Field(
        None, description="event field -> regex (a dotted key reaches a nested field: body.ref)"
    )
    start: Name | None = Field(None, description="start an instance of this flow")
    data: dict[str, EventTemplate] | None = Field(
        None, description="with start: data field -> template such as '{event.path}'"
    )
    send: SendSpec | None = Field(None, description="send an event to the selected instances")
    pause: SelectorSpec | None = Field(None, description="pause the selected instances")
    resume: SelectorSpec | None = Field(None, description="resume the selected instances")
    kill: SelectorSpec | None = Field(None, description="kill the selected instances")
    exec: list[EventTemplate] | None = Field(
        None, description="run this argv (no shell) with the event as JSON on stdin"
    )
    webhook: WebhookSpec | None = Field(None, description="send an HTTP request")
    once_per: OncePerSpec | None = Field(
        None, description="with exec/webhook: one delivery per key per window"
    )
    retry_for: Duration = Field(
        3600.0, description="with exec/webhook: how long a failed delivery is retried"
    )
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
        if self.once_per is not None and actions[0] not in DELIVERED:
            raise ValueError("once_per: applies to exec: and webhook: only")
        if self.exec is not None and not self.exec:
            raise ValueError("exec: needs at least the program")
        return self

    @property
    def action(self) -> str:
        """The action name: one of :data:`ACTIONS`."""
        return next(a for a in ACTIONS if getattr(self, a) is not None)


class OnFailureSpec(Strict):
    """A flow's ``on_failure:``: sugar for a ``lifecycle`` sensor named ``on_failure`` on
    this flow's ``failed``, ``budget_spent`` and ``restarts_spent`` transitions, and a
    rule running exactly one of ``exec`` or ``webhook`` for each."""

    exec: list[EventTemplate] | None = Field(
        None, description="run this argv (no shell) with the event as JSON on stdin"
    )
    webhook: WebhookSpec | None = Field(None, description="send an HTTP request")
    once_per: OncePerSpec | None = Field(None, description="one delivery per key per window")
    retry_for: Duration = Field(3600.0, description="how long a failed delivery is retried")

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.exec is None) == (self.webhook is None):
            raise ValueError("on_failure needs exactly one of exec, webhook")
        return self

    def rule(self) -> RuleSpec:
        """The rule this sugar stands for (``when: on_failure``)."""
        return RuleSpec(
            when=ON_FAILURE,
            exec=self.exec,
            webhook=self.webhook,
            once_per=self.once_per,
            retry_for=self.retry_for,
        )


#: The sensor name ``on_failure:`` declares.
ON_FAILURE = "on_failure"
#: The lifecycle kinds ``on_failure:`` hears.
ON_FAILURE_KINDS = ("failed", "budget_spent", "restarts_spent")


def delivery_templates(rule: RuleSpec) -> list[tuple[tuple[str | int, ...], str]]:
    """The ``(location under the rule, template)`` pairs of a rule's ``exec``,
    ``webhook`` and ``once_per`` (for the check of the event fields they name)."""
    out: list[tuple[tuple[str | int, ...], str]] = [
        (("exec", j), a) for j, a in enumerate(rule.exec or [])
    ]
    if rule.webhook is not None:
        hook = rule.webhook
        out.append((("webhook", "url"), hook.url))
        out += [(("webhook", "headers", k), v) for k, v in hook.headers.items()]
        if hook.body is not None:
            out.append((("webhook", "body"), hook.body))
    if rule.once_per is not None and "key" in rule.once_per.model_fields_set:
        out.append((("once_per", "key"), rule.once_per.key))
    return out
