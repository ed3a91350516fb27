"""The flow file keys that set up a handler's process: its environment, secrets and
working folder, resource limits and user.

``env`` (a variable name → a ``{data.…}`` template) and ``secrets`` (a variable name →
where its value is read) are given in ``defaults`` and per state; a state's entries are
merged over the defaults' (``runner.flowspec.setup``). ``working_dir`` and ``limits`` are
per state. Used by ``runner.flowspec.spec``.
"""

# No ``from __future__ import annotations``: see runner.flowspec.spec.
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator

from runner.flowspec.spec_types import IDENT_RE, Duration, Strict
from runner.templating import placeholders

EnvName = Annotated[str, Field(pattern=IDENT_RE)]
"""An environment variable's name (letters, digits, ``_``; not starting with a digit)."""


def _check_data_template(value: str) -> str:
    for path in placeholders(value):
        if path.split(".")[0] != "data":
            raise ValueError(f"placeholder {{{path}}} is not allowed here (expected {{data.…}})")
    return value


CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"
"""systemd's folder of the service's credentials (``LoadCredential=``), where a relative
secret file is looked for first."""

DataTemplate = Annotated[str, AfterValidator(_check_data_template)]
"""Text with ``{data.…}`` placeholders, rendered for each attempt."""


class SecretSpec(Strict):
    """Where one secret's value comes from: exactly one of ``file`` and ``env``."""

    file: str | None = Field(
        None,
        description="a file holding the value (read when the attempt starts; a relative "
        "path is from the flows folder, or from $CREDENTIALS_DIRECTORY where systemd sets it)",
    )
    env: EnvName | None = Field(None, description="a variable of the daemon's environment")

    @model_validator(mode="after")
    def _one_source(self) -> "SecretSpec":
        if (self.file is None) == (self.env is None):
            raise ValueError("a secret takes exactly one of file: PATH and env: NAME")
        return self

    def path(self, flows_dir: Path, credentials_dir: str | None) -> Path:
        """The file to read (``file`` only): absolute as given; a relative one in
        ``credentials_dir`` (``$CREDENTIALS_DIRECTORY``) when that folder has it, else
        under ``flows_dir``."""
        assert self.file is not None
        given = Path(self.file)
        if given.is_absolute():
            return given
        if credentials_dir and (Path(credentials_dir) / given).exists():
            return Path(credentials_dir) / given
        return flows_dir / given


class WorkingDirSpec(Strict):
    """An ``exec`` handler's working folder (``working_dir: PATH`` is short for
    ``working_dir: {path: PATH}``)."""

    path: DataTemplate = Field(
        description="the folder, a '{data.…}' template; a relative path is from the flows folder"
    )
    create: bool = Field(False, description="create it (and its parents) when it is missing")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SI = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(value: object) -> int:
    """Bytes from ``512MiB``, ``1GiB``, ``64M`` (binary: ``M`` = ``MiB``), ``100MB``
    (decimal), ``4096`` or ``4096B``. Raises ``ValueError`` for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a size: {value!r} (expected e.g. 512MiB, 2GiB, 100MB)")
    unit = match.group(2).upper()
    prefix = unit.rstrip("B").rstrip("I")
    scale = _SI[prefix] if unit.endswith("B") and "I" not in unit and prefix else _UNITS[prefix]
    return int(float(match.group(1)) * scale)


ByteSize = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _SIZE.pattern},
                {"type": "integer", "minimum": 1},
            ],
            "description": "a size: 512MiB, 2GiB, 64M (binary), 100MB (decimal), or bytes",
        }
    ),
]
"""Bytes; accepts ``512MiB``/``2GiB``/``64M``/``100MB`` or a number of bytes."""


class LimitsSpec(Strict):
    """Resource limits of an ``exec`` handler's process, set in it before its program
    starts (``setrlimit``, ``setpriority``); its children inherit them."""

    memory: ByteSize | None = Field(None, description="address space (RLIMIT_AS), e.g. 512MiB")
    cpu: Duration | None = Field(None, description="CPU time (RLIMIT_CPU), whole seconds")
    files: int | None = Field(None, ge=1, description="open descriptors (RLIMIT_NOFILE)")
    processes: int | None = Field(
        None, ge=1, description="processes of the handler's user (RLIMIT_NPROC; not for root)"
    )
    nice: int | None = Field(None, ge=0, le=19, description="scheduling niceness, 0 to 19")
