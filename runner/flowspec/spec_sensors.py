"""The ``sensors:`` of a flow file: pydantic models of each sensor kind and the fields of
their events.

A sensor is exactly one of ``files`` (:class:`FilesSpec`), ``tail`` (:class:`TailSpec`),
``every`` or ``cron`` (:class:`SensorSpec`), ``lifecycle`` (:class:`LifecycleSpec`),
``webhook`` (:class:`WebhookInSpec`); what
each kind's events carry is :data:`EVENT_FIELDS` (the sensors live in ``runner.sensors``).
"""

import re
from typing import Any, Literal, Self, get_args

from pydantic import Field, field_validator, model_validator

from runner.flowspec.spec_handler import EnvName
from runner.flowspec.spec_types import Duration, Name, OptDuration, Regex, SensorRunsOn, Strict


class FilesSpec(Strict):
    """Watch a folder for new files (``path`` relative to the flow file's folder).

    A file counts once per path and inode: touching or rewriting a file already handled
    starts nothing, unless ``modified: true`` (then each settled change of its size or
    modification time is a new event). A symlink that leads out of the folder is ignored
    unless ``follow_symlinks: true``.
    """

    path: str = Field(description="folder to watch, relative to the flow file's folder")
    glob: str = Field("*", description="file name pattern (fnmatch; with '/' the relative path)")
    recursive: bool = Field(False, description="also watch sub-folders")
    settle: Duration = Field(0.2, description="size must be stable this long (seconds)")
    force_polling: bool = Field(False, description="poll instead of OS file events")
    modified: bool = Field(
        False, description="a changed file (new size or mtime) counts again (default: once)"
    )
    follow_symlinks: bool = Field(
        False,
        description="a symlink leading out of the folder counts too (default: ignored)",
    )


class TailSpec(Strict):
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


LifecycleKind = Literal[
    "failed",
    "budget_spent",
    "restarts_spent",
    "killed",
    "deadline_missed",
    "completed",
    "paused",
    "resumed",
    "retried",
    "lost",
]
#: What a ``lifecycle`` sensor listens to without ``on:``.
LIFECYCLE_DEFAULT_ON: tuple[LifecycleKind, ...] = (
    "failed",
    "budget_spent",
    "restarts_spent",
    "deadline_missed",
)
#: Every kind of lifecycle event (a ``lifecycle`` sensor's ``on:``).
LIFECYCLE_KINDS: tuple[str, ...] = get_args(LifecycleKind)


class LifecycleSpec(Strict):
    """flowrun's own instance transitions as events: those of ``flows`` (default: every
    flow) of the kinds ``on``. ``failed`` also hears every other transition into status
    failed (``budget_spent`` or ``restarts_spent`` with ``on_exhausted: failed``)."""

    flows: list[Name] | None = Field(None, description="flows watched (default: every flow)")
    on: list[LifecycleKind] = Field(
        list(LIFECYCLE_DEFAULT_ON),
        description="kinds of transitions (default: failed, budget_spent, restarts_spent, "
        "deadline_missed)",
    )


class HmacSpec(Strict):
    """A webhook signed GitHub's way: ``header`` carries ``sha256=<hex>``, the HMAC-SHA256
    of the raw body keyed with the secret in the daemon's environment variable
    ``secret_env``."""

    secret_env: EnvName = Field(description="the daemon's environment variable holding the key")
    header: str = Field(
        "X-Hub-Signature-256",
        pattern=r"^[A-Za-z0-9-]+$",
        description="the header carrying sha256=<hex> (default: GitHub's X-Hub-Signature-256)",
    )


#: Longest webhook path (characters).
WEBHOOK_PATH_MAX = 200


class WebhookInSpec(Strict):
    """Requests from other systems as events: a ``POST`` of JSON to ``path`` on the
    daemon's HTTP listener (``--http`` or ``--metrics``), authenticated by a bearer token
    (``token_env``: the daemon's environment variable holding it) or an HMAC signature
    (``hmac``); ``unauthenticated: true`` instead serves it to anyone who can reach the
    listener (loopback only)."""

    path: str = Field(
        pattern=r"^/[A-Za-z0-9._~/-]*$",
        max_length=WEBHOOK_PATH_MAX,
        description="URL path served, e.g. /hooks/deploy (unique across flows)",
    )
    token_env: EnvName | None = Field(
        None, description="the daemon's environment variable holding the bearer token"
    )
    hmac: HmacSpec | None = Field(None, description="an HMAC-SHA256 signature header instead")
    unauthenticated: bool = Field(
        False, description="no token nor signature (refused on a listener beyond loopback)"
    )

    @field_validator("path", mode="before")
    @classmethod
    def _slash(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.startswith("/"):
            raise ValueError(f"a webhook path starts with '/' (e.g. /{value})")
        return value

    @model_validator(mode="after")
    def _one_auth(self) -> Self:
        given = [k for k in ("token_env", "hmac") if getattr(self, k) is not None]
        if self.unauthenticated:
            given.append("unauthenticated")
        if len(given) != 1:
            got = ", ".join(given) or "none"
            raise ValueError(
                f"a webhook needs exactly one of token_env, hmac (or unauthenticated: true) "
                f"(got: {got})"
            )
        return self

    def secret_env(self) -> str | None:
        """The environment variable holding this webhook's secret (``None``: none)."""
        return self.token_env or (self.hmac.secret_env if self.hmac else None)


def _check_cron(value: str | None) -> str | None:
    from croniter import croniter  # only flows with a cron sensor pay for its import

    if value is not None and not croniter.is_valid(value):
        raise ValueError(f"invalid cron expression {value!r} (expected e.g. '0 3 * * *')")
    return value


_KINDS = ("files", "tail", "every", "cron", "lifecycle", "webhook")


class SensorSpec(Strict):
    """A sensor: exactly one of ``files``, ``tail``, ``every`` (seconds), ``cron``,
    ``lifecycle`` or ``webhook``."""

    files: FilesSpec | None = Field(None, description="new files in a folder")
    tail: TailSpec | None = Field(None, description="lines appended to a log file")
    every: OptDuration = Field(None, description="a tick every this long (seconds)")
    cron: str | None = Field(
        None, description="a tick at each time of this cron expression (host's local time)"
    )
    lifecycle: LifecycleSpec | None = Field(
        None, description="flowrun's own instance transitions (failed, killed, ...)"
    )
    webhook: WebhookInSpec | None = Field(
        None, description="JSON POSTed by other systems to a path of the daemon's listener"
    )
    description: str | None = Field(None, description="free text")
    runs_on: SensorRunsOn | None = Field(
        None,
        description="only daemons with these labels run this sensor: label -> value "
        "(every daemon has host: its host name)",
    )

    @model_validator(mode="before")
    @classmethod
    def _empty_lifecycle(cls, value: Any) -> Any:
        # ``lifecycle:`` with nothing after it means every flow, the default kinds
        if isinstance(value, dict) and "lifecycle" in value and value["lifecycle"] is None:
            value = {**value, "lifecycle": {}}
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        return _check_cron(value)

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        kinds = [k for k in _KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            got = ", ".join(kinds) or "none"
            raise ValueError(f"a sensor needs exactly one of {', '.join(_KINDS)} (got: {got})")
        return self

    @property
    def kind(self) -> str:
        """``"files"``, ``"tail"``, ``"every"``, ``"cron"``, ``"lifecycle"`` or
        ``"webhook"``."""
        return next(k for k in _KINDS if getattr(self, k) is not None)


#: The fields of each sensor kind's events (the payload keys the sensors in
#: ``runner.sensors`` write; a test runs every sensor and compares). A ``tail`` event also
#: has one field per named group of its ``match`` regex (:func:`event_fields`).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "files": ("path", "name", "size", "host"),
    "tail": ("line", "file", "host"),
    "every": ("tick", "scheduled", "missed"),
    "cron": ("tick", "scheduled", "missed"),
    "lifecycle": (
        "instance",
        "flow",
        "version",
        "state",
        "status",
        "kind",
        "label",
        "error",
        "attempts",
        "errors",
        "restarts",
        "worker",
        "at",
        "explain",
    ),
    "webhook": ("body", "headers"),
}


def event_fields(sensor: SensorSpec) -> list[str]:
    """The field names of ``sensor``'s events: :data:`EVENT_FIELDS` of its kind, plus a
    ``tail`` regex's named groups (first)."""
    fields = list(EVENT_FIELDS[sensor.kind])
    if sensor.tail is not None and sensor.tail.match:
        groups = list(re.compile(sensor.tail.match).groupindex)
        fields = [*groups, *(f for f in fields if f not in groups)]
    return fields
