"""What the ``flowrun`` global options resolve to: the ``Ctx`` every subcommand receives
(``pass_ctx``), and the ``WorkerConfig`` they describe (``worker_config``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from runner.engine.worker import WorkerConfig
from runner.errors import ConfigError, FlowErrors
from runner.store.db import make_engine


class Ctx:
    """What the global options resolve to; the engine is opened on first use.

    Args:
        flows: the flows folder (``--flows``).
        db: the database URL (``--db``).
        lease: seconds a claim lasts without renewal (``--lease``).

    ``worker_options`` (set by the ``flowrun`` group) holds ``concurrency`` (int),
    ``worker_id`` (str or ``None``), ``exit_when_idle`` (bool), ``log_format``
    (``"text"``/``"json"``) and ``grace`` (seconds).
    """

    def __init__(self, flows: Path, db: str, lease: float):
        self.flows, self.db, self.lease = flows, db, lease
        self.worker_options: dict[str, Any] = {}
        self._engine = None

    @property
    def engine(self):
        """The database engine (created, and the schema upgraded, on first use).

        Raises:
            ConfigError: a malformed URL or an unreachable database.
        """
        if self._engine is None:
            self._engine = make_engine(self.db)
        return self._engine

    def registry(self, *, strict: bool = False):
        """The flows folder loaded (a ``FlowRegistry``); with ``strict``, any error aborts.

        Raises:
            ConfigError: the flows folder does not exist (exit 2).
            FlowErrors: with ``strict``, every load error (exit 2).
        """
        from runner.flowspec.registry import FlowRegistry

        if not self.flows.is_dir():
            raise ConfigError(
                f"{self.flows}: flows folder not found (set --flows or FLOWRUN_FLOWS)"
            )
        reg = FlowRegistry(self.flows)
        errors = reg.load_all()
        if errors and strict:
            raise FlowErrors(errors)
        return reg


pass_ctx = click.make_pass_decorator(Ctx)
"""Decorator passing the current ``Ctx`` as a command's first argument."""


def worker_config(c: Ctx) -> WorkerConfig:
    """The ``WorkerConfig`` the global options in ``c`` describe (lease and grace in
    seconds); raises ``KeyError`` if ``c.worker_options`` was never set."""
    o = c.worker_options
    cfg = WorkerConfig(
        lease=c.lease,
        concurrency=o["concurrency"],
        grace=o["grace"],
        exit_when_idle=o["exit_when_idle"],
        idle_poll=o.get("idle_poll"),
    )
    if o["worker_id"]:
        cfg.worker_id = o["worker_id"]
    return cfg
