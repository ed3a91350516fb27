"""Checks of a flow's handler set-up that are true only of this machine, now: a secret
file that is missing or unreadable (a warning of ``flowrun check``: the flow is valid, its
attempts will be errors until the file is there), and a ``user``/``group`` that this
daemon cannot drop to (the daemon refuses the flow as it loads it)."""

from __future__ import annotations

import os
from pathlib import Path

from runner.errors import FlowError
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.spec_handler import CREDENTIALS_ENV, SecretSpec


def setup_warnings(flow: CompiledFlow) -> list[FlowError]:
    """One ``FlowError`` (``file:line:col``) per secret file of ``flow`` that cannot be
    read now; its text names the file, never its content. Raises nothing."""
    if flow.spec is None:
        return []
    folder = Path(flow.path).resolve().parent
    out: list[FlowError] = []
    places: list[tuple[tuple[str, ...], dict[str, SecretSpec] | None]]
    places = [(("defaults",), flow.spec.defaults.secrets)]
    places += [(("states", n), st.secrets) for n, st in flow.spec.states.items()]
    for loc, secrets in places:
        for name, spec in (secrets or {}).items():
            if spec.file is None:
                continue
            path = spec.path(folder, os.environ.get(CREDENTIALS_ENV))
            if path.is_file() and os.access(path, os.R_OK):
                continue
            why = "not readable" if path.exists() else "no such file"
            line, col = flow.spec.position((*loc, "secrets", name, "file"))
            message = f"warning: secret {name}: {path}: {why}"
            out.append(FlowError(message, flow.path, line, col))
    return out


def privilege_errors(flow: CompiledFlow) -> list[FlowError]:
    """What a daemon must refuse of ``flow`` as it loads it: a ``user``/``group`` when the
    daemon does not run as root (it could not drop to them), or one that this machine
    does not know. One ``FlowError`` (``file:line:col``) each; raises nothing."""
    if flow.spec is None:
        return []
    out: list[FlowError] = []
    for name, st in flow.spec.states.items():
        for key, value in (("user", st.user), ("group", st.group)):
            if value is None:
                continue
            problem: str | None
            if os.geteuid() != 0:
                problem = (
                    f"{key} {value!r} needs a daemon running as root "
                    f"(this one runs as uid {os.geteuid()}): the state's handlers cannot run"
                )
            elif (problem := id_problem(key, value)) is None:
                continue
            line, col = flow.spec.position(("states", name, key))
            out.append(FlowError(problem, flow.path, line, col))
    return out


def id_problem(key: str, value: str | int) -> str | None:
    """Why ``user``/``group`` ``value`` cannot be used here (an unknown name), or ``None``."""
    import grp
    import pwd

    if isinstance(value, int):
        return None if value >= 0 else f"{key} {value}: not an id"
    try:
        (pwd.getpwnam if key == "user" else grp.getgrnam)(value)
    except KeyError:
        return f"{key} {value!r}: no such {key} on this machine"
    return None
