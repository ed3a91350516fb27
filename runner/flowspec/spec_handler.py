"""The flow file keys that set up a handler's process: its environment, secrets and
working folder.

``env`` (a variable name → a ``{data.…}`` template) and ``secrets`` (a variable name →
where its value is read) are given in ``defaults`` and per state; a state's entries are
merged over the defaults' (``runner.flowspec.setup``). ``working_dir`` is per state. Used
by ``runner.flowspec.spec``.
"""

# No ``from __future__ import annotations``: see runner.flowspec.spec.
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from runner.flowspec.spec_types import IDENT_RE, Strict
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
