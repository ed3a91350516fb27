"""What the READMEs and the `init` template tell a newcomer is true: the test files they
cite exist, a shell block never assumes `flowrun` on PATH before saying how it gets
there, and the template's comments say what the keys do."""

from __future__ import annotations

import re
from pathlib import Path

from runner.cli.init import EXAMPLE_FLOW

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [ROOT / "README.md", ROOT / "flows" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_cited_test_files_exist() -> None:
    for text in TEXTS:
        for cited in re.findall(r"\btests/[\w/]+\.py\b", text.read_text(encoding="utf-8")):
            assert (ROOT / cited).is_file(), f"{text.relative_to(ROOT)} cites {cited}"


def test_readme_puts_flowrun_on_path_before_a_bare_flowrun() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    on_path = False
    for block in blocks:
        for line in block.splitlines():
            if "bin/activate" in line:
                on_path = True
            bare = re.match(r"\s*(?:cd \S+ && )?flowrun\b", line)
            assert on_path or not bare, f"README runs `flowrun` before it is on PATH: {line}"


def test_init_template_says_a_timeout_is_a_restart() -> None:
    [line] = [ln for ln in EXAMPLE_FLOW.splitlines() if ln.strip().startswith("timeout:")]
    assert "restart" in line and "error" not in line


def test_no_package_or_large_binary_is_committed() -> None:
    """Tools are installed with pip (`pip install py-spy`), never committed."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        path = ROOT / name.decode()
        assert not path.name.endswith((".whl", ".tar.gz")), f"{name.decode()} is committed"
        if path.is_file():
            assert path.stat().st_size < 1_000_000, f"{name.decode()} is over 1 MB"
