"""The callbacks of ``flowrun``'s global options (``runner.cli.main``) whose values are
parsed: each returns the parsed value or raises one ``click.BadParameter`` line naming
its option."""

from __future__ import annotations

import click

from runner.retention import Retention, parse_retention, parse_window


def labels_option(value: str | None) -> str:
    """``--labels``' callback: the labels as stored (``runner.labels.canonical``, ``host``
    added), or one usage error line."""
    from runner.labels import canonical, parse

    try:
        return canonical(parse(value)) or "{}"
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--labels") from None


def retention_option(value: str | Retention) -> Retention:
    """``--retention``'s callback: the parsed policy, or one usage error line."""
    if isinstance(value, Retention):
        return value
    try:
        return parse_retention(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--retention") from None


def log_store_max_option(value: str | int | None) -> int | None:
    """``--log-store-max``'s callback: bytes; 0 for ``none``; ``None`` when not given."""
    if value is None or isinstance(value, int):
        return value
    if value.strip().lower() in ("none", "0"):
        return 0
    from runner.flowspec.spec_handler import parse_size

    try:
        return parse_size(value.strip())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--log-store-max") from None


def window_option(value: str | float | None) -> float | None:
    """``--event-retention``'s callback: seconds, ``None`` for forever."""
    if value is None or isinstance(value, float):
        return value
    try:
        return parse_window(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--event-retention") from None
