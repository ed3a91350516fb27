"""A state's handler set-up: the environment variables, secrets and working folder of its
process.

``state_setup`` merges a flow's ``defaults:`` with one state's own ``env`` and
``secrets`` (a state's entry wins over the default's of the same name). The result is
frozen and holds plain values. Pure: no I/O (the secrets are read when an attempt starts:
``runner.handlers.secrets``).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.flowspec.spec import Defaults, StateSpec
from runner.flowspec.spec_handler import SecretSpec


@dataclass(frozen=True)
class HandlerSetup:
    """What a handler's process gets besides its argv.

    Attributes:
        env: ``((name, template), ...)``: variables whose ``{data.…}`` templates are
            rendered for each attempt and set over the base environment.
        secrets: ``((name, SecretSpec), ...)``: variables whose values are read when the
            attempt starts and never stored.
        inherit: the base environment: ``"daemon"`` (the daemon's, less the variables
            that carry its credentials) or ``"none"`` (a minimal one).
        working_dir: the working folder's ``{data.…}`` template (relative: from the flows
            folder), or ``None`` for the flows folder.
        create_dir: create the working folder when it is missing.
        limits: ``((name, value), ...)`` of the ``limits`` given: ``memory`` (bytes),
            ``cpu`` (seconds), ``files``, ``processes``, ``nice``.
        user: the user (name or uid) to run the handler as, or ``None``.
        group: the group (name or gid), or ``None`` (the user's own).
    """

    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, SecretSpec], ...] = ()
    inherit: str = "daemon"
    working_dir: str | None = None
    create_dir: bool = False
    limits: tuple[tuple[str, float], ...] = ()
    user: str | int | None = None
    group: str | int | None = None

    @property
    def env_names(self) -> tuple[str, ...]:
        """The names of the ``env`` variables, in file order."""
        return tuple(name for name, _ in self.env)

    @property
    def secret_sources(self) -> tuple[str, ...]:
        """The daemon's variables secrets are read from (``{env: NAME}``): left out of the
        handler's base environment, so that it has the value under the secret's name only."""
        return tuple(spec.env for _, spec in self.secrets if spec.env is not None)

    @property
    def secret_names(self) -> tuple[str, ...]:
        """The names of the secrets (never their values), in file order."""
        return tuple(name for name, _ in self.secrets)


NO_SETUP = HandlerSetup()
"""The set-up of a state that sets nothing (and of a state built by hand)."""


def state_setup(defaults: Defaults, st: StateSpec) -> HandlerSetup:
    """The effective ``HandlerSetup`` of state ``st`` under the flow's ``defaults``: the
    state's ``env``/``secrets`` entries merged over the defaults' by name, its
    ``env_inherit`` over the default's. Both arguments are validated spec models, so this
    raises nothing."""
    env = {**(defaults.env or {}), **(st.env or {})}
    secrets = {**(defaults.secrets or {}), **(st.secrets or {})}
    inherit = st.env_inherit or defaults.env_inherit or "daemon"
    wd = st.working_dir
    limits = tuple(
        (k, v) for k, v in (st.limits.model_dump() if st.limits else {}).items() if v is not None
    )
    ids = (st.user, st.group)
    if not env and not secrets and inherit == "daemon" and wd is None and not limits:
        if ids == (None, None):
            return NO_SETUP
    return HandlerSetup(
        env=tuple(env.items()),
        secrets=tuple(secrets.items()),
        inherit=inherit,
        working_dir=wd.path if wd is not None else None,
        create_dir=wd.create if wd is not None else False,
        limits=limits,
        user=st.user,
        group=st.group,
    )
