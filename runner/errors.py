"""Errors that reach users as one clear line, never a traceback.

``FlowError`` carries a position (``file:line:col``, 1-based) when there is one;
``FlowErrors`` bundles every error found in one load; ``ConfigError`` covers options and
databases; ``UserError`` is any other user mistake with the exit code the CLI should use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    """Every ``FlowError`` found while loading one or more flow files.

    ``partial``: for one file with errors, what of it still compiled
    (``runner.flowspec.compiler.PartialFlow``: the cross-flow checks of the folder run
    on it too), else ``None``."""

    def __init__(self, errors: list[FlowError], partial: Any = None):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors
        self.partial = partial


class ConfigError(Exception):
    """A bad option, URL, or an unreachable database (exit code 2 unless said otherwise)."""

    exit_code = 2


class UserError(Exception):
    """Any other user mistake: ``message`` is printed as one line, ``exit_code`` returned."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


#: SQLite's primary result code for a write to a read-only database (``SQLITE_READONLY``).
SQLITE_READONLY = 8
#: PostgreSQL's SQLSTATE for a write in a read-only transaction (a standby, or
#: ``default_transaction_read_only``).
PG_READ_ONLY = "25006"


def read_only_database(exc: BaseException) -> bool:
    """True when ``exc`` (a driver error, or SQLAlchemy's wrapping ``exc.orig``) says the
    database cannot be written at all: a read-only SQLite file, folder or mount, or a
    read-only PostgreSQL server. That is the set-up's fault, not a passing failure: trying
    again does not help."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == SQLITE_READONLY:
        return True
    if getattr(orig, "sqlstate", None) == PG_READ_ONLY:
        return True
    return "readonly database" in str(orig)


def database_failure(exc: BaseException) -> str:
    """One line for a database error that interrupted a command or a console action:
    the driver's first line (``exc.orig`` for SQLAlchemy errors), a full disk or a
    read-only database (:func:`read_only_database`) named."""
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    text = lines[0][:200] if lines else type(exc).__name__
    if read_only_database(exc):
        return (
            f"the database is read-only: {text} (flowrun writes the database, and on SQLite "
            "its -wal and -shm files and their folder: check the permissions and the mount)"
        )
    if "disk is full" in text or "No space left" in text or "disk I/O error" in text:
        return f"database write failed: {text} (free some disk space and try again)"
    return f"database error: {text} (nothing was changed; try again)"


class IllegalMove(Exception):
    """A state or status transition the compiled machine does not allow."""
