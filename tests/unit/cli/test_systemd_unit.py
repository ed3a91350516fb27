"""The shipped systemd unit keeps the database URL out of ``systemctl show``: it comes
as a credential (``LoadCredential=``), under the name flowrun reads."""

from __future__ import annotations

from pathlib import Path

from runner.cli.context import DB_CREDENTIAL

UNIT = Path(__file__).resolve().parents[3] / "contrib" / "systemd" / "flowrun.service"


def test_the_database_url_is_a_credential() -> None:
    lines = [line.strip() for line in UNIT.read_text().splitlines()]
    settings = [line for line in lines if line and not line.startswith("#")]
    assert not any(s.startswith("Environment=FLOWRUN_DB") for s in settings)
    creds = [s.split("=", 1)[1] for s in settings if s.startswith("LoadCredential=")]
    assert [c.split(":", 1)[0] for c in creds] == [DB_CREDENTIAL]
