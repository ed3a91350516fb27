"""runner.handlers.secrets: where a secret's value is read from when an attempt starts: a
file relative to ``$CREDENTIALS_DIRECTORY`` (systemd's ``LoadCredential=``) when that
folder has it, else to the flows folder; or the daemon's environment. Real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.flowspec.spec_handler import SecretSpec
from runner.handlers.secrets import SetupError, read_secret


def test_a_relative_file_is_read_from_credentials_directory_first(tmp_path: Path) -> None:
    flows, creds = tmp_path / "flows", tmp_path / "creds"
    flows.mkdir()
    creds.mkdir()
    (flows / "api").write_text("from-flows\n")
    (flows / "other").write_text("other-from-flows\r\n")
    (creds / "api").write_text("from-credentials\n")
    environ = {"CREDENTIALS_DIRECTORY": str(creds)}
    assert read_secret("API", SecretSpec(file="api"), flows, environ) == "from-credentials"
    # not in the credentials folder: the flows folder's
    assert read_secret("O", SecretSpec(file="other"), flows, environ) == "other-from-flows"
    assert read_secret("API", SecretSpec(file="api"), flows, {}) == "from-flows"
    absolute = SecretSpec(file=str(flows / "api"))
    assert read_secret("API", absolute, tmp_path, environ) == "from-flows"


def test_an_env_secret_and_the_errors_name_the_source_never_a_value(tmp_path: Path) -> None:
    assert read_secret("K", SecretSpec(env="SRC"), tmp_path, {"SRC": "v\n"}) == "v\n"
    with pytest.raises(SetupError, match="secret K: the daemon's environment has no SRC"):
        read_secret("K", SecretSpec(env="SRC"), tmp_path, {})
    with pytest.raises(SetupError) as info:
        read_secret("K", SecretSpec(file="gone.key"), tmp_path, {})
    gone = tmp_path / "gone.key"
    assert str(info.value) == f"secret K: cannot read {gone}: No such file or directory"


def test_a_file_is_read_again_for_every_attempt_and_a_folder_is_an_error(tmp_path: Path) -> None:
    key = tmp_path / "api"
    key.write_text("first\n")
    spec = SecretSpec(file="api")
    assert read_secret("API", spec, tmp_path, {}) == "first"
    key.write_text("second\n")  # same size: still read again (no cache of any kind)
    assert read_secret("API", spec, tmp_path, {}) == "second"
    key.write_bytes(b"x" * 200_000)  # more than one read
    assert read_secret("API", spec, tmp_path, {}) == "x" * 200_000
    creds = tmp_path / "creds"
    (creds / "api").mkdir(parents=True)  # there, but not a file: named, no fallback
    with pytest.raises(SetupError, match=f"cannot read {creds / 'api'}: Is a directory"):
        read_secret("API", spec, tmp_path, {"CREDENTIALS_DIRECTORY": str(creds)})
