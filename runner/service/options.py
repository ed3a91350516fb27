"""What ``flowrun --daemon`` is given and what it returns: the typed options of its
optional parts (:class:`ServiceOptions`, from the CLI or the console) and how it ended
(:class:`Served`: the exit code, the worker's counts, the supervisor).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.engine.worker import Worker
from runner.retention import DEFAULT, EVENT_WINDOW, Retention
from runner.service.sdnotify import Notifier
from runner.service.supervisor import Supervisor


@dataclass(frozen=True)
class ServiceOptions:
    """The optional parts of ``flowrun --daemon`` (the CLI's options, typed).

    Attributes:
        metrics: ``(host, port)`` to serve Prometheus ``/metrics`` on, or ``None``.
        http: ``(host, port)`` of the daemon's HTTP listener (webhook sensors, and
            ``/metrics`` with ``metrics``), or ``None``: ``metrics``'s address, if any.
            Both given must name the same address (one listener).
        progress: show progress until idle (``--exit-when-idle``): a rich bar when
            ``tty`` (``None``: stderr is a terminal), else a line every 5 s.
        status_every: seconds between status lines (counts by status, attempts/s).
        log_attempts: one INFO line per finished attempt (``flowrun.attempts``).
        notifier: the systemd notifier (``None``: from the environment).
        prune_every: seconds between the pruner's rounds (``runner.service.pruner``;
            ``None``: no pruner, the default of an embedded worker).
        retention: the pruner's policy for flows without their own (``--retention``).
        event_retention: seconds handled events are kept (``None``: forever).
        listen_url: PostgreSQL: the URL whose connection ``LISTEN``s (``--listen-db``: a
            direct connection to the same database when the engine's goes through a
            transaction-pooling pooler); ``None``: the engine's own URL, or no ``LISTEN``
            at all (polling, with a WARNING) behind such a pooler.
    """

    metrics: tuple[str, int] | None = None
    http: tuple[str, int] | None = None  # wiring: http listener (--http)
    progress: bool = False
    tty: bool | None = None
    status_every: float = 60.0
    log_attempts: bool = False
    notifier: Notifier | None = None
    prune_every: float | None = None
    retention: Retention = DEFAULT
    event_retention: float | None = EVENT_WINDOW
    listen_url: str | None = None
    log_store_max: int | None = None  # wiring: logs (--log-store-max; None: 1 GiB on SQLite)


@dataclass
class Served:
    """How a daemon ended: ``code`` is its exit code (0 clean stop or idle exit, 70 a part
    could not be kept alive, 128 + signal number after an abort by a second signal);
    ``worker`` (its ``stats``), the ``supervisor`` and the HTTP listener's port actually
    bound (``--metrics``/``--http``)."""

    worker: Worker
    code: int
    supervisor: Supervisor
    metrics_port: int | None = None
