"""A database error as one line for a log or a message (an outage is not a bug), and
SQLite's "database is locked" told apart. No SQLAlchemy needed: the errors are only read.
"""

from __future__ import annotations


def short_error(exc: BaseException) -> str:
    """The first line of a database error, for a one-line log (an outage is not a bug)."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def first_line(exc: object) -> str:
    """The first non-empty line of ``exc``'s text, or its type's name."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def is_busy(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" (another writer holds the lock)."""
    text = str(getattr(exc, "orig", None) or exc)
    return "database is locked" in text or "database is busy" in text
