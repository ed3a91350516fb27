"""Pydantic models of the flow file (format version 1): the flow, its defaults, its states.

The models mirror the YAML exactly (``extra="forbid"``); YAML keys that are awkward in
Python are aliases: ``exec`` → ``StateSpec.exec_``, ``next`` → ``StateSpec.next_``,
``on`` → ``StateSpec.on_``. Every duration is stored as float seconds. The field types
are in ``runner.flowspec.spec_types``, the sensors' models in
``runner.flowspec.spec_sensors``, the rules' in ``runner.flowspec.spec_rules``;
``runner.flowspec.loader.load_flow_text`` parses a file into a :class:`FlowSpec`, keeping
every node's position.
"""

# No ``from __future__ import annotations`` in the spec modules: pydantic would evaluate
# every field's annotation string when the models are made (3 ms of a daemon's start).
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, PrivateAttr

from runner.flowspec.spec_handler import (
    ByteSize,
    DataTemplate,
    EnvName,
    LimitsSpec,
    SecretSpec,
    WorkingDirSpec,
)
from runner.flowspec.spec_rules import OnFailureSpec, RuleSpec
from runner.flowspec.spec_sensors import SensorSpec
from runner.flowspec.spec_types import (
    CALL_RE,
    IDENT_RE,
    Duration,
    ExecArg,
    LabelTemplate,
    Name,
    OptDuration,
    Rate,
    RunsOn,
    StateName,
    Strict,
    Window,
)


class ErrorBudgetSpec(Strict):
    """At most ``max_errors`` errors within ``window`` seconds, then ``on_exhausted``."""

    max_errors: int = Field(8, ge=1, description="errors allowed within the window")
    window: Duration = Field(4 * 3600.0, description="sliding window (seconds)")
    on_exhausted: str = Field(
        "failed", description="what happens when the budget is spent: failed, paused or a state"
    )


class BackoffSpec(Strict):
    """Delay after an error: ``initial * factor**(n-1)`` seconds, capped at ``max``, jittered."""

    initial: Duration = Field(10.0, description="first delay (seconds)")
    factor: float = Field(2.0, ge=1.0, description="multiplier per consecutive error")
    max: Duration = Field(600.0, description="largest delay (seconds)")
    jitter: Literal["full", "equal", "none"] = Field(
        "full", description="randomise each delay: full (0..delay), equal (delay/2..delay), none"
    )


class RoutingTimeoutSpec(Strict):
    """``routing_timeout: {after: 10m, then: cleanup}``: what happens to an instance whose
    ``runs_on`` no live worker matches."""

    after: Duration = Field(
        description="how long no live worker has matched the instance's runs_on (seconds)"
    )
    then: str = Field("failed", description="a state of the flow, or failed")


def _routing(value: Any) -> Any:
    return value if isinstance(value, dict) or value is None else {"after": value}


class DeadlineSpec(Strict):
    """How long an instance may stay in a state (or in its flow), and what then."""

    after: Duration = Field(gt=0, description="how long, e.g. 3d, 1h, 90s")
    since: Literal["entered", "created"] | None = Field(
        None,
        description="counted from entering the state (entered; a state's default) or from "
        "the instance's start (created; the flow's)",
    )
    then: str = Field(
        description="when it passes: a state of this flow (the instance moves there), failed, "
        "paused, or alert (only a deadline_missed lifecycle event)"
    )


class Defaults(Strict):
    """Policy applied to every state unless the state overrides a key."""

    try_interval: Duration = Field(30.0, description="delay before retrying a 'not yet'")
    timeout: OptDuration = Field(300.0, description="hard limit of one attempt (null: none)")
    keepalive: OptDuration = Field(None, description="handler must signal within this")
    error_budget: ErrorBudgetSpec = Field(default_factory=ErrorBudgetSpec)
    backoff: BackoffSpec = Field(default_factory=BackoffSpec)
    max_restarts: int = Field(5, ge=0, description="lost attempts allowed in one state")
    log_max: ByteSize = Field(
        10 << 20,
        description="bytes of output kept per attempt: the first 1 MiB and the last part, "
        "e.g. 10MiB",
    )
    env: dict[EnvName, DataTemplate] | None = Field(
        None, description="variables every handler gets: name -> '{data.…}' template"
    )
    secrets: dict[EnvName, SecretSpec] | None = Field(
        None, description="secret variables every handler gets: name -> where its value is"
    )
    env_inherit: Literal["daemon", "none"] | None = Field(
        None,
        description="base environment: daemon (the daemon's, less its credentials; the "
        "default) or none (PATH, HOME, LANG, TZ only)",
    )
    runs_on: RunsOn | None = Field(
        None,
        description="worker labels every handler state needs: label -> value, a '{data.…}' "
        "or '{event.…}' template (a daemon's labels: flowrun --daemon --labels)",
    )
    routing_timeout: Annotated[RoutingTimeoutSpec, BeforeValidator(_routing)] | None = Field(
        None,
        description="DURATION, or {after: DURATION, then: STATE|failed}: an instance whose "
        "runs_on no live worker has matched for that long moves to 'then' (default failed)",
    )


POLICY_KEYS = tuple(
    k
    for k in Defaults.model_fields
    if k not in ("env", "secrets", "env_inherit", "runs_on", "routing_timeout")
)
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


def _dir(value: Any) -> Any:
    return {"path": value} if isinstance(value, str) else value


def _listify(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class StateSpec(Strict):
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
    log_max: ByteSize | None = Field(None, description="overrides defaults.log_max")
    env: dict[EnvName, DataTemplate] | None = Field(
        None, description="variables of this state's handler, merged over defaults.env"
    )
    secrets: dict[EnvName, SecretSpec] | None = Field(
        None, description="secret variables of this state's handler, merged over defaults.secrets"
    )
    env_inherit: Literal["daemon", "none"] | None = Field(
        None, description="overrides defaults.env_inherit"
    )
    working_dir: Annotated[WorkingDirSpec | None, BeforeValidator(_dir)] = Field(
        None, description="exec: the working folder (default: the flows folder)"
    )
    limits: LimitsSpec | None = Field(
        None, description="exec: resource limits of the handler's process"
    )
    user: str | int | None = Field(
        None, description="exec: the user (name or uid) the handler runs as (a root daemon)"
    )
    group: str | int | None = Field(
        None, description="exec: the group (name or gid); default: the user's own group"
    )
    pool: Name | None = Field(
        None,
        description="a pool (declared under 'pools' in a flow file) whose slots this state's "
        "attempts hold while they run, across every daemon",
    )
    slots: int | None = Field(
        None, ge=1, description="slots of the pool one attempt holds (default 1; needs pool)"
    )
    rate: Rate | None = Field(
        None,
        description="at most COUNT attempt starts of this state per DURATION across every "
        "daemon: 10/1m",
    )
    priority: int | None = Field(
        None,
        ge=1,
        le=9,
        description="1..9, overrides the flow's priority while an instance is in this state "
        "(flowrun start --priority overrides both)",
    )
    runs_on: RunsOn | None = Field(
        None,
        description="worker labels this state's attempts need, merged over defaults.runs_on: "
        "label -> value, a '{data.…}' or '{event.…}' template ('' removes a default's)",
    )
    routing_timeout: Annotated[RoutingTimeoutSpec, BeforeValidator(_routing)] | None = Field(
        None, description="overrides defaults.routing_timeout"
    )
    deadline: DeadlineSpec | None = Field(
        None,
        description="{after, since, then}: when the instance is still in this state 'after' "
        "its entry (or its start: since created), 'then' acts and a deadline_missed "
        "lifecycle event is stored",
    )


class PoolSpec(Strict):
    """A pool declared with more than its slots."""

    slots: int = Field(ge=1, description="slots in use at once at most, across every daemon")
    rate: Rate | None = Field(
        None, description="at most COUNT attempt starts in this pool per DURATION: 10/1m"
    )


def _pool(value: Any) -> Any:
    return {"slots": value} if isinstance(value, int) and not isinstance(value, bool) else value


class MaxRunningSpec(Strict):
    """A flow limit declared with a key (``max_running: {limit: 1, key: "{data.c}"}``)."""

    limit: int = Field(
        ge=1, description="attempts of this flow's instances running at once, across every daemon"
    )
    key: DataTemplate | None = Field(
        None,
        description="a '{data.…}' template rendered when an instance is made: the limit holds "
        "per value (instances of different keys run side by side)",
    )


def _max_running(value: Any) -> Any:
    return {"limit": value} if isinstance(value, int) and not isinstance(value, bool) else value


class RetentionSpec(Strict):
    """How long this flow's terminal instances are kept, per status (a status not given
    keeps the daemon's window, ``--retention``)."""

    completed: Window | None = Field(
        None, description="after completing: a duration or forever (daemon default 30d)"
    )
    failed: Window | None = Field(
        None, description="after failing: a duration or forever (daemon default 90d)"
    )
    killed: Window | None = Field(
        None, description="after a kill: a duration or forever (daemon default 30d)"
    )

    def overrides(self) -> dict[str, float | None]:
        """``{status: seconds or None for forever}`` of the statuses given."""
        return {
            k: (None if isinstance(v, str) else v)  # the only text a window holds: forever
            for k, v in (
                ("completed", self.completed),
                ("failed", self.failed),
                ("killed", self.killed),
            )
            if v is not None
        }


class FlowSpec(Strict):
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
    pools: dict[Name, Annotated[PoolSpec, BeforeValidator(_pool)]] = Field(
        default_factory=dict,
        description="pool name -> slots, or {slots, rate}: at most that many slots in use at "
        "once across every daemon (a state takes one with 'pool'); every file declaring a "
        "pool declares it alike; 'flowrun pool set' changes the slots at run time",
    )
    on_failure: OnFailureSpec | None = Field(
        None,
        description="exec or webhook on each failed, budget_spent or restarts_spent "
        "instance of this flow (a lifecycle sensor 'on_failure' and its rule)",
    )
    priority: int = Field(
        5,
        ge=1,
        le=9,
        description="1..9: among due instances the higher priority is claimed first (then "
        "the earliest due), and a pool's free slot goes to it; a state's own overrides it",
    )
    max_running: Annotated[MaxRunningSpec, BeforeValidator(_max_running)] | None = Field(
        None,
        description="N, or {limit, key}: at most N of this flow's instances (per key) run an "
        "attempt at once, across every daemon; the others wait",
    )
    on_limit: Literal["queue", "skip"] = Field(
        "queue",
        description="a rule starting an instance while max_running instances (per key) are "
        "live in handler states: queue (make it; it waits) or skip (make none; the event "
        "records the skip)",
    )
    deadline: DeadlineSpec | None = Field(
        None,
        description="{after, then}: when an instance has not ended 'after' its start, 'then' "
        "acts (a state, failed, paused or alert) and a deadline_missed lifecycle event is "
        "stored; since is always created",
    )
    retention: RetentionSpec | None = Field(
        None,
        description="how long terminal instances are kept (a duration or 'forever' per "
        "status); unset: the daemon's --retention",
    )

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

    def position(
        self, loc: tuple[str | int, ...], *, key: bool = False
    ) -> tuple[int | None, int | None]:
        """1-based ``(line, col)`` of the node at ``loc`` (YAML key names, list indexes).

        Args:
            loc: e.g. ``("states", "validate", "next")`` or ``("rules", 0, "when")``.
            key: the position of the mapping key rather than of its value.
        Returns ``(None, None)`` when unknown (e.g. a spec built without a file).
        """
        if self._positions is None:
            return (None, None)
        return self._positions.find(loc, key=key)
