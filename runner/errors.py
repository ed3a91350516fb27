"""Errors that reach users as one clear line, never a traceback.

``FlowError`` carries a position (``file:line:col``, 1-based) when there is one;
``FlowErrors`` bundles every error found in one load; ``ConfigError`` covers options and
databases; ``UserError`` is any other user mistake with the exit code the CLI should use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FlowError(Exception):
    """One mistake in a flow file.

    Args:
        message: what is wrong and what was expected.
        file: path of the flow file (``None`` when not tied to a file).
        line: 1-based line, or ``None``.
        col: 1-based column, or ``None``.
    """

    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = self.file or ""
        if self.file and self.line is not None:
            where += f":{self.line}:{self.col or 1}"
        return f"{where}: {self.message}" if where else self.message


class FlowErrors(Exception):
    """Every ``FlowError`` found while loading one or more flow files."""

    def __init__(self, errors: list[FlowError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


class ConfigError(Exception):
    """A bad option, URL, or an unreachable database (exit code 2 unless said otherwise)."""

    exit_code = 2


class UserError(Exception):
    """Any other user mistake: ``message`` is printed as one line, ``exit_code`` returned."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def database_failure(exc: BaseException) -> str:
    """One line for a database error that interrupted a command or a console action:
    the driver's first line (``exc.orig`` for SQLAlchemy errors), a full disk named."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    text = lines[0][:200] if lines else type(exc).__name__
    if "disk is full" in text or "No space left" in text or "disk I/O error" in text:
        return f"database write failed: {text} (free some disk space and try again)"
    return f"database error: {text} (nothing was changed; try again)"


class IllegalMove(Exception):
    """A state or status transition the compiled machine does not allow."""
