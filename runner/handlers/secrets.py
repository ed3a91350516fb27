"""A state's ``env`` rendered, its ``secrets`` read and its working folder made ready,
when an attempt starts.

``attempt_vars`` gives the variables an attempt's handler gets on top of its base
environment (``runner.handlers.exec_handler.handler_env``) and the secret values to
redact (``runner.handlers.redact``) from whatever is kept of the attempt;
``working_dir`` the folder an ``exec`` handler starts in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.flowspec.setup import HandlerSetup
from runner.flowspec.spec_handler import CREDENTIALS_ENV, SecretSpec
from runner.templating import render


class SetupError(Exception):
    """An attempt's handler cannot be set up: a placeholder without a value, a secret
    that cannot be read. Its text names the variable and the file, never a value."""


def attempt_vars(
    setup: HandlerSetup,
    data: dict[str, Any],
    flows_dir: Path,
    environ: Mapping[str, str] = os.environ,
) -> tuple[dict[str, str], dict[str, str]]:
    """``(env, secrets)``: the state's ``env`` templates rendered over ``data`` and its
    secrets' values (``name -> value``), read now.

    Args:
        setup: the state's set-up (``CompiledState.setup``).
        data: the instance data the templates see as ``data``.
        flows_dir: the folder relative secret files are read from.
        environ: the daemon's environment (``{env: NAME}`` secrets, ``$CREDENTIALS_DIRECTORY``).

    Raises ``SetupError`` (its text names the variable, or the file; never a value).
    """
    context = {"data": data}
    env = {}
    for name, template in setup.env:
        try:
            env[name] = render(template, context)
        except KeyError as exc:
            raise SetupError(f"env {name}: placeholder {{{exc.args[0]}}} has no value") from None
    secrets = {name: read_secret(name, spec, flows_dir, environ) for name, spec in setup.secrets}
    return env, secrets


def read_secret(
    name: str, spec: SecretSpec, flows_dir: Path, environ: Mapping[str, str] = os.environ
) -> str:
    """The value of secret ``name``: the daemon's variable ``spec.env``, or the content of
    the file ``spec.file`` (UTF-8; one trailing newline dropped).

    Raises ``SetupError`` naming the variable or the file when it cannot be read.
    """
    if spec.env is not None:
        value = environ.get(spec.env)
        if value is None:
            raise SetupError(f"secret {name}: the daemon's environment has no {spec.env}")
        return value
    path = spec.path(flows_dir, environ.get(CREDENTIALS_ENV))
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SetupError(f"secret {name}: cannot read {path}: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", "surrogateescape")
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


def working_dir(setup: HandlerSetup, data: dict[str, Any], flows_dir: Path) -> Path:
    """The folder an ``exec`` handler of ``setup`` starts in: ``flows_dir`` unless the
    state has a ``working_dir`` (its template rendered over ``data``; relative to
    ``flows_dir``), created first (with its parents) when the state says ``create``.

    Raises ``SetupError`` naming the folder when it is missing (and not to be created),
    not a folder, or cannot be created.
    """
    if setup.working_dir is None:
        return flows_dir
    try:
        folder = flows_dir / render(setup.working_dir, {"data": data})
    except KeyError as exc:
        raise SetupError(f"working_dir: placeholder {{{exc.args[0]}}} has no value") from None
    if setup.create_dir:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SetupError(
                f"working_dir: cannot create {folder}: {exc.strerror or exc}"
            ) from None
    elif not folder.is_dir():
        why = "not a folder" if folder.exists() else "no such folder (create: true makes it)"
        raise SetupError(f"working_dir {folder}: {why}")
    return folder
