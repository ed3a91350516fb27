"""Warnings about a flow's handler set-up that are true only of this machine, now: a
secret file that is missing or unreadable (the flow is valid; its attempts will be
errors until the file is there). For ``flowrun check``."""

from __future__ import annotations

import os
from pathlib import Path

from runner.errors import FlowError
from runner.flowspec.compiled import CompiledFlow
from runner.flowspec.spec_handler import CREDENTIALS_ENV


def setup_warnings(flow: CompiledFlow) -> list[FlowError]:
    """One ``FlowError`` (``file:line:col``) per secret file of ``flow`` that cannot be
    read now; its text names the file, never its content. Raises nothing."""
    if flow.spec is None:
        return []
    folder = Path(flow.path).resolve().parent
    out: list[FlowError] = []
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
