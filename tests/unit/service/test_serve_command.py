"""The command ``flowrun serve`` runs per browser session carries the global options the
operator gave (flows folder, lease, PostgreSQL pool size) but not the database URL, and
the CLI accepts it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from runner.service.serve import console_command


def test_console_command_carries_the_pool_size_not_the_db(tmp_path: Path) -> None:
    argv = shlex.split(console_command(tmp_path, 30.0, attach=True, readonly=False, pool=1))
    tui = argv.index("tui")
    options = argv[:tui]
    assert options[options.index("--pool-size") + 1] == "1"
    assert options[options.index("--lease") + 1] == "30"
    assert "--db" not in options
    assert argv[tui + 1 :] == ["--attach"]
    # the real CLI parses those global options (``tui --help`` stops before opening anything)
    env = {**os.environ, "FLOWRUN_DB": f"sqlite:///{tmp_path / 'f.db'}"}
    done = subprocess.run(
        [*argv[: tui + 1], "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
