"""What the ``flowrun`` global options resolve to: the ``Ctx`` every subcommand receives
(``pass_ctx``), and the ``WorkerConfig`` they describe (``worker_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from runner.errors import ConfigError, FlowErrors, UserError
from runner.literal import literal
from runner.retention import DEFAULT as DEFAULT_RETENTION
from runner.retention import EVENT_WINDOW, Retention

if TYPE_CHECKING:  # imported where used: `flowrun --help` and `check` stay light
    from sqlalchemy import Engine

    from runner.engine.config import WorkerConfig
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.registry import FlowRegistry
    from runner.store.reader import Reader

#: Subcommands that only read or act on existing instances: on a SQLite database file
#: that does not exist they say so and never create it (the listings ``ls``, ``events``
#: and ``workers`` then list nothing, exit 0; the others exit 1).
READ_ONLY = frozenset(
    {"ls", "show", "events", "workers", "pause", "resume", "kill", "retry", "send", "logs"}
)


_CREATES = (
    "nothing has run here yet; `flowrun start FLOW` or `flowrun --daemon` creates it, "
    "--db/FLOWRUN_DB chooses another"
)


#: The systemd credential (``LoadCredential=flowrun-db:FILE``) holding the database URL.
DB_CREDENTIAL = "flowrun-db"


def credential_db(environ: Mapping[str, str]) -> str | None:
    """The database URL in ``$CREDENTIALS_DIRECTORY/flowrun-db`` (systemd's
    ``LoadCredential=``), surrounding whitespace stripped; ``None`` when the variable is
    unset or the file does not exist. Used only when neither ``--db`` nor ``FLOWRUN_DB``
    is given.

    Raises:
        ConfigError: the file cannot be read or is empty (exit 2).
    """
    folder = environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return None
    path = Path(folder) / DB_CREDENTIAL
    try:
        url = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the database URL: {exc}") from None
    if not url:
        raise ConfigError(f"{path}: empty; it should hold the database URL")
    return url


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite ``url`` when it does not exist yet, else ``None`` (any other
    database, an in-memory one, or a URL that does not parse: ``make_engine`` reports it)."""
    if not url.startswith("sqlite"):
        return None  # decided without loading SQLAlchemy
    from sqlalchemy.engine import make_url

    from runner.store.db import normalize_url

    try:
        parsed = make_url(normalize_url(url))
    except Exception:  # reported by make_engine with one clear line
        return None
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database)
    return None if path.exists() else path


@dataclass(frozen=True)
class WorkerOptions:
    """The worker's global options (set by the ``flowrun`` group).

    Attributes:
        concurrency: ``--concurrency`` (``None``: ``runner.engine.config.default_concurrency``).
        prefetch: ``--prefetch`` (``None``: the engine's default).
        worker_id: ``--worker-id`` (``None``: host:pid).
        exit_when_idle: ``--exit-when-idle``.
        log_format: ``"text"`` or ``"json"`` (``--log-format``).
        grace: seconds running attempts get at a stop (``--grace``).
        idle_poll: seconds between idle looks when woken by notifications (``--idle-poll``;
            ``None``: half the lease, ``0``: never).
        labels: ``--labels`` as stored (``runner.labels.canonical``; ``None``: host only).
    """

    concurrency: int | None = None
    prefetch: int | None = None
    worker_id: str | None = None
    exit_when_idle: bool = False
    log_format: str = "text"
    grace: float = 30.0
    idle_poll: float | None = None
    labels: str | None = None


@dataclass(frozen=True)
class DaemonOptions:
    """The ``--daemon``-only global options: ``log_level`` (``"debug"`` ... ``"error"``),
    ``log_attempts`` (one INFO line per finished attempt), ``metrics`` and ``http`` (the
    ``[HOST:]PORT`` texts as given, ``None``: no metrics, no ``--http``)."""

    log_level: str = "info"
    log_attempts: bool = False
    metrics: str | None = None
    http: str | None = None


@dataclass(frozen=True)
class RetentionOptions:
    """``--retention`` (the policy for flows without their own), ``--event-retention``
    (seconds, ``None``: forever), ``--prune-every`` (seconds, ``None``: no pruner) and
    ``--log-store-max`` (bytes; 0: no bound; ``None``: 1 GiB on SQLite, none on
    PostgreSQL)."""

    retention: Retention = DEFAULT_RETENTION
    event_retention: float | None = EVENT_WINDOW
    prune_every: float | None = 300.0
    log_store_max: int | None = None


def _sqlite_url(url: str) -> bool:
    """True when ``url`` names a SQLite database (False for any other, or a URL that does
    not parse: ``make_engine`` reports that one)."""
    from sqlalchemy.engine import make_url

    from runner.store.db import normalize_url

    try:
        return make_url(normalize_url(url)).drivername.startswith("sqlite")
    except Exception:  # reported by make_engine with one clear line
        return False


class Ctx:
    """What the global options resolve to; the engine is opened on first use.

    Args:
        flows: the flows folder (``--flows``).
        db: the database URL (``--db``).
        lease: seconds a claim lasts without renewal (``--lease``).
        pool: PostgreSQL: the most connections the engine opens (``--pool-size``).

    ``worker_options``, ``daemon_options`` and ``retention`` (set by the ``flowrun``
    group) are a :class:`WorkerOptions`, a :class:`DaemonOptions` and a
    :class:`RetentionOptions`.
    """

    def __init__(self, flows: Path, db: str, lease: float, pool: int = 2):
        self.flows, self.db, self.lease, self.pool = flows, db, lease, pool
        #: PostgreSQL: how this process's connections are named in ``pg_stat_activity``.
        self.application_name = "flowrun"
        self.worker_options = WorkerOptions()
        self.daemon_options = DaemonOptions()
        #: ``--retention``, ``--event-retention``, ``--prune-every``
        self.retention = RetentionOptions()
        #: PostgreSQL: ``auto``, ``transaction`` or ``none`` (``--db-pooler``,
        #: ``runner.store.pooler``).
        self.pooler = "auto"
        #: PostgreSQL: the direct URL a daemon or the console's worker listens on
        #: (``--listen-db``), or ``None``.
        self.listen_db: str | None = None
        #: Set for ``READ_ONLY`` subcommands: never create a database.
        self.read_only = False
        self._engine: Engine | None = None
        self._reader: Reader | None = None
        #: ``log_level``, ``log_attempts``, ``metrics``: the daemon's options.
        self.service_options: dict[str, Any] = {}

    @property
    def engine(self):
        """The database engine (created, and the schema upgraded, on first use).

        Raises:
            ConfigError: a malformed URL or an unreachable database.
            UserError: with ``read_only``, a SQLite database file that does not exist
                (exit 1; it is not created).
        """
        if self._engine is None:
            from runner.store.db import make_engine

            missing = missing_sqlite_file(self.db) if self.read_only else None
            if missing is not None:
                raise UserError(f"no database at {missing} ({_CREATES})", 1)
            self._engine = make_engine(
                self.db,
                pool=self.pool,
                application_name=self.application_name,
                pooler=self.pooler,
            )
        return self._engine

    def nothing_to_list(self) -> bool:
        """For a listing (``ls``, ``events``, ``workers``): True when the SQLite database
        file does not exist yet, after one note on stderr naming it. Listing nothing is
        not an error (exit 0), and the file is not created."""
        if self._engine is not None:
            return False
        from runner.store.reader import sqlite_file

        plain = sqlite_file(self.db)
        if plain is not None and Path(plain).is_file():
            return False  # the common case, decided without loading SQLAlchemy
        missing = missing_sqlite_file(self.db)
        if missing is None:
            return False
        click.echo(f"flowrun: no database at {missing} yet: nothing to list ({_CREATES})", err=True)
        return True

    @property
    def reader(self):
        """The read side's ``runner.store.reader.Reader`` (opened on first use).

        On a database already at this flowrun's schema revision, no SQLAlchemy: a SQLite
        file through stdlib ``sqlite3``, read-only (``runner.store.reader.open_sqlite``), a
        PostgreSQL database through ``psycopg`` alone (``runner.store.pg_reader``).
        Anything else (a missing, older or unmigrated database, a URL with parameters, a
        server that does not answer, an engine already open) reads through
        :attr:`engine`, which creates, upgrades, refuses or reports the database as every
        command does.

        Raises:
            ConfigError, UserError: as :attr:`engine`.
        """
        if self._reader is None:
            if self._engine is None:
                from runner.store.reader import open_sqlite
                from runner.store.revision import latest_revision

                self._reader = open_sqlite(self.db, latest_revision())
                if self._reader is None and self.db.startswith("postgresql"):
                    from runner.store.pg_reader import open_postgres

                    self._reader = open_postgres(self.db, latest_revision(), self.application_name)
            if self._reader is None:
                from runner.store.reader import EngineReader

                self._reader = EngineReader(self.engine)
        return self._reader

    def registry(self, *, strict: bool = False) -> FlowRegistry:
        """The flows folder loaded (a ``FlowRegistry``); with ``strict``, any error aborts.

        Raises:
            ConfigError: the flows folder does not exist (exit 2).
            FlowErrors: with ``strict``, every load error (exit 2).
        """
        from runner.flowspec.registry import FlowRegistry

        if not self.flows.is_dir():
            raise ConfigError(
                f"{self.flows}: flows folder not found (set --flows or FLOWRUN_FLOWS; "
                "`flowrun init` creates one)"
            )
        reg = FlowRegistry(self.flows)
        errors = reg.load_all()
        if errors and strict:
            raise FlowErrors(errors)
        return reg


def flow_to_start(c: Ctx, name: str) -> CompiledFlow:
    """The ``CompiledFlow`` ``flowrun start NAME`` creates an instance of.

    The flows folder's version when it loads; when the flow's file has errors, those are
    printed on stderr (``file:line:col: message``) and the newest version stored in the
    database is used instead, saying so on stderr.

    Raises:
        UserError: no flow ``name`` in the folder and none stored (exit 2), or its file
            has errors and no version of it is stored (exit 2).
        ConfigError: the flows folder does not exist, or the database cannot be opened.
    """
    from runner.store import versions

    reg = c.registry()
    if name in reg.flows:
        return reg.flows[name]
    stored = versions.latest(c.engine, name)
    known = {Path(stored["path"]).resolve()} if stored else set()
    broken = [p for p in reg.errors if Path(p).stem == name or Path(p).resolve() in known]
    if not broken:
        return reg.get(name)  # raises the "unknown flow" line

    for path in broken:
        click.echo(f"flowrun: {literal(path)} has errors:", err=True)
        for e in reg.errors[path]:
            click.echo(f"  {literal(e, lines=True)}", err=True)
    if stored is None:
        raise UserError(f"flow '{name}' has errors and no good version of it is stored", 2)
    from runner.ops.views import iso

    click.echo(
        f"flowrun: starting {name} from its last good version {stored['version']} "
        f"(first loaded {iso(stored['loaded_at'])}); fix the file to start the new one",
        err=True,
    )
    return versions.compiled(c.engine, stored["version"])


pass_ctx = click.make_pass_decorator(Ctx)
"""Decorator passing the current ``Ctx`` as a command's first argument."""


def worker_config(c: Ctx) -> WorkerConfig:
    """The ``WorkerConfig`` the global options in ``c`` describe (lease and grace in
    seconds).

    Raises:
        ConfigError: ``--prefetch`` above 0 with a SQLite ``--db`` (exit 2).
    """
    from runner.engine.config import WorkerConfig

    o = c.worker_options
    if o.prefetch and _sqlite_url(c.db):
        raise ConfigError(
            f"--prefetch {o.prefetch}: not on SQLite (a daemon stopped while it holds claims "
            "ahead can keep the others from taking over; see docs/cli.md); use 0 or leave it out"
        )
    cfg = WorkerConfig(
        lease=c.lease,
        prefetch=o.prefetch,
        grace=o.grace,
        exit_when_idle=o.exit_when_idle,
        idle_poll=o.idle_poll,
    )
    if o.worker_id:
        cfg.worker_id = o.worker_id
    if o.concurrency is not None:  # else the default, 16 per core
        cfg.concurrency = o.concurrency
    if o.labels is not None:  # else host only
        cfg.labels = o.labels
    return cfg
