"""The ``flowrun`` command (the contract: ``docs/cli.md``): the group and its
global options, the daemon and console entries, and ``main``.

The subcommands live in ``runner.cli.operator`` (instances, commands, events, workers) and
``runner.cli.flows`` (check, graph, schema); the options' context in
``runner.cli.context``, their parsing callbacks in ``runner.cli.global_options``, the
daemon's entry in ``runner.cli.daemon``.

Every user mistake — a bad flow, an unknown id, a bad URL, an unreachable database — is one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from runner.cli import flows as cli_flows
from runner.cli import init as cli_init
from runner.cli import operator as cli_operator
from runner.cli.context import (
    READ_ONLY,
    Ctx,
    DaemonOptions,
    RetentionOptions,
    WorkerOptions,
    credential_db,
    pass_ctx,
    worker_config,
)
from runner.cli.daemon import run_daemon
from runner.cli.global_options import (
    labels_option,
    log_store_max_option,
    retention_option,
    window_option,
)
from runner.errors import (
    ConfigError,
    FlowErrors,
    UserError,
    database_failure,
    read_only_database,
)
from runner.literal import literal
from runner.retention import DEFAULT as DEFAULT_RETENTION
from runner.retention import EVENT_WINDOW

#: The default ``--db`` (the same as ``runner.store.db.DEFAULT_URL``, which a unit test
#: checks): spelled here so that ``flowrun --help`` need not import SQLAlchemy.
DEFAULT_URL = "sqlite:///.flowrun/flowrun.db"

EPILOG = """\b
Exit codes: 0 ok (--daemon: clean stop or idle exit); 1 unknown id (or a refused
command); 2 bad flows, config or usage, or a read-only database; 70 a daemon part
could not be kept alive; 75 the database failed mid-command (full disk, lost
connection): nothing was changed;
130/143 a daemon aborted by a second SIGINT/SIGTERM.
Every option also reads its FLOWRUN_* variable (FLOWRUN_FLOWS, FLOWRUN_DB, FLOWRUN_LEASE,
FLOWRUN_RETENTION, ...).
"""


@click.group(invoke_without_command=True, epilog=EPILOG)
@click.option(
    "--flows",
    type=click.Path(path_type=Path),
    envvar="FLOWRUN_FLOWS",
    default="flows",
    show_default=True,
    help="Folder of flow files (*.yaml).",
)
@click.option(
    "--db",
    envvar="FLOWRUN_DB",
    default=DEFAULT_URL,
    show_default=True,
    help="Database URL: sqlite:///path or postgresql+psycopg://user@host/db. Neither this "
    "nor FLOWRUN_DB given: the file $CREDENTIALS_DIRECTORY/flowrun-db (systemd "
    "LoadCredential=) when present, else the default.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=1),
    envvar="FLOWRUN_LEASE",
    default=60.0,
    show_default=True,
    help="Seconds a claim lasts without renewal.",
)
@click.option("--daemon", is_flag=True, help="Run headless: worker + sensors + rules + reload.")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    envvar="FLOWRUN_CONCURRENCY",
    help="Attempts run at once by this worker (default: 16 per core this process may run "
    "on, at most 256).",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=None,
    envvar="FLOWRUN_PREFETCH",
    help="Most instances claimed ahead of the free slots while attempts end quickly, "
    "started the moment a slot frees (default: --concurrency on PostgreSQL, 0 on SQLite; "
    "0: never).",
)
@click.option("--worker-id", envvar="FLOWRUN_WORKER_ID", help="Worker id (default host:pid).")
@click.option(
    "--labels",
    envvar="FLOWRUN_LABELS",
    default=None,
    callback=lambda _ctx, _param, value: labels_option(value),
    help="This worker's labels, NAME=VALUE,...: it runs only the states (and sensors) whose "
    "runs_on they cover; host=<host name> is added unless given (e.g. gpu=1,site=paris).",
)
@click.option(
    "--exit-when-idle",
    is_flag=True,
    help="Exit 0 once nothing is runnable, due, running or pending.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="On SIGINT/SIGTERM, seconds running attempts get to finish.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    envvar="FLOWRUN_LOG_LEVEL",
    help="--daemon: least severe log level shown.",
)
@click.option("--log-attempts", is_flag=True, help="--daemon: one INFO line per finished attempt.")
@click.option(
    "--metrics",
    metavar="[HOST:]PORT",
    envvar="FLOWRUN_METRICS",
    help="--daemon: serve Prometheus /metrics here (loopback when only a port).",
)
@click.option(
    "--http",
    metavar="[HOST:]PORT",
    envvar="FLOWRUN_HTTP",
    help="--daemon: serve the webhook sensors here (loopback when only a port; the same "
    "listener as --metrics: give both the same address or one). Beyond loopback only "
    "when every webhook sensor has token_env or hmac.",
)
@click.option(
    "--idle-poll",
    type=click.FloatRange(min=0),
    default=None,
    envvar="FLOWRUN_IDLE_POLL",
    help="--daemon on PostgreSQL: an idle worker woken by LISTEN/NOTIFY still looks for due "
    "work every S seconds (default: half the lease; 0: never).",
)
@click.option(
    "--pool-size",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    envvar="FLOWRUN_POOL_SIZE",
    help="PostgreSQL: most connections this process opens for statements (two kept open "
    "once opened: a --daemon's worker runs two cycles at once with 2 or more); --daemon "
    "adds one listening connection.",
)
@click.option(
    "--retention",
    envvar="FLOWRUN_RETENTION",
    default=DEFAULT_RETENTION.text(),
    show_default=True,
    callback=lambda _ctx, _param, value: retention_option(value),
    help="How long terminal instances are kept where a flow file sets no retention: one "
    "window for all (30d, 12h, forever) or STATUS=WINDOW pairs (completed, failed, killed).",
)
@click.option(
    "--event-retention",
    envvar="FLOWRUN_EVENT_RETENTION",
    default="30d",
    show_default=True,
    callback=lambda _ctx, _param, value: window_option(value),
    help="How long a handled sensor event is kept once no instance it started is left "
    "(a duration or forever).",
)
@click.option(
    "--log-store-max",
    envvar="FLOWRUN_LOG_STORE_MAX",
    default=None,
    callback=lambda _ctx, _param, value: log_store_max_option(value),
    help="--daemon: bytes all attempt logs may take (e.g. 1GiB, none); past it the pruner "
    "deletes the oldest terminal instances' logs first.  [default: 1GiB on SQLite, none on "
    "PostgreSQL]",
)
@click.option(
    "--prune-every",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    envvar="FLOWRUN_PRUNE_EVERY",
    help="--daemon: seconds between the pruner's rounds (0: no pruner in this daemon).",
)
@click.option(
    "--db-pooler",
    type=click.Choice(["auto", "transaction", "none"]),
    default="auto",
    show_default=True,
    envvar="FLOWRUN_DB_POOLER",
    help="PostgreSQL: is --db reached through a transaction-pooling pooler (PgBouncer's "
    "pool_mode = transaction)? Then nothing is prepared on the server and LISTEN needs "
    "--listen-db. auto: found out on connecting; none: direct or session pooling. A "
    "pooler= parameter of the URL wins.",
)
@click.option(
    "--listen-db",
    metavar="URL",
    envvar="FLOWRUN_LISTEN_DB",
    help="--daemon, the console's worker and logs -f on PostgreSQL: LISTEN for wake-ups on "
    "this direct URL of the same database (default: --db's; behind a transaction-pooling "
    "pooler, without it, the worker polls).",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=lambda ctx, _param, value: _version(ctx, value),
    help="Show the version (and how exec handlers are started) and exit.",
)
@click.pass_context
def main_group(
    ctx,
    flows,
    db,
    lease,
    daemon,
    concurrency,
    worker_id,
    exit_when_idle,
    log_format,
    grace,
    log_level="info",
    log_attempts=False,
    metrics=None,
    http=None,
    idle_poll=None,
    pool_size=2,
    prefetch=None,
    retention=DEFAULT_RETENTION,
    event_retention=EVENT_WINDOW,
    prune_every=300.0,
    log_store_max=None,
    db_pooler="auto",
    listen_db=None,
    labels=None,
):
    """flowrun: declarative YAML flows, persisted instances, an operator console.

    Without a command: `flowrun` opens the console (with an embedded worker);
    `flowrun --daemon` runs the headless worker.
    """
    if ctx.get_parameter_source("db") is click.core.ParameterSource.DEFAULT:
        db = credential_db(os.environ) or db
    ctx.obj = Ctx(flows, db, lease, pool=pool_size)
    ctx.obj.pooler, ctx.obj.listen_db = db_pooler, listen_db
    ctx.obj.application_name = f"flowrun {ctx.invoked_subcommand or 'console'}"
    ctx.obj.read_only = ctx.invoked_subcommand in READ_ONLY
    ctx.obj.worker_options = WorkerOptions(
        concurrency=concurrency,
        prefetch=prefetch,
        worker_id=worker_id,
        exit_when_idle=exit_when_idle,
        log_format=log_format,
        grace=grace,
        idle_poll=idle_poll,
        labels=labels,
    )
    ctx.obj.daemon_options = DaemonOptions(log_level, log_attempts, metrics, http)
    ctx.obj.retention = RetentionOptions(
        retention, event_retention, prune_every or None, log_store_max
    )
    if ctx.invoked_subcommand is None:
        if daemon:
            raise SystemExit(run_daemon(ctx.obj))
        ctx.invoke(tui)


@main_group.command()
@click.option("--attach", is_flag=True, help="Observe and command only; run no worker here.")
@click.option("--readonly", is_flag=True, help="Refuse every command.")
@pass_ctx
def tui(c: Ctx, attach: bool, readonly: bool):
    """Open the operator console (with an embedded worker unless --attach).

    \f
    Raises:
        ConfigError: no flows folder without ``--attach``, or the database cannot be
            opened.
        FlowErrors: a flow file has errors (the embedded worker refuses to start).
    """
    from runner.service.console import run_console

    attach = attach or readonly
    config = None if attach else worker_config(c)
    run_console(c, attach=attach, readonly=readonly, config=config)


for _sub in (*cli_operator.COMMANDS, *cli_flows.COMMANDS, *cli_init.COMMANDS):
    main_group.add_command(_sub)
del _sub


EXIT_DATABASE = 75
"""Exit code of a command the database failed (full disk, lost connection): nothing of
it was written; trying again later may work (``EX_TEMPFAIL`` of sysexits.h)."""


def _add_novel_commands() -> None:
    """Add the commands that live in modules of their own (explain, sleep/wake, events
    replay, rules test, migrate, serve, prune); each module imports its heavy parts inside
    its command bodies."""
    from runner.cli import explain as cli_explain
    from runner.cli import logs as cli_logs
    from runner.cli import migrate as cli_migrate
    from runner.cli import pools as cli_pools
    from runner.cli import prune as cli_prune
    from runner.cli import rules as cli_rules
    from runner.cli import serve as cli_serve
    from runner.cli import sleep as cli_sleep

    novel: tuple[click.Command, ...] = (
        *cli_explain.COMMANDS,
        *cli_sleep.COMMANDS,
        *cli_migrate.COMMANDS,
    )
    novel += (*cli_serve.COMMANDS, *cli_prune.COMMANDS, *cli_logs.COMMANDS)
    novel += tuple(cli_pools.COMMANDS)
    for sub in (*novel, cli_rules.rules_group):
        main_group.add_command(sub)
    # `flowrun events` (the listing) stays the default of the `events` group
    main_group.add_command(cli_rules.events_group(main_group.commands["events"]))


_add_novel_commands()


def _database_errors() -> tuple[type[Exception], ...]:
    """SQLAlchemy's ``DBAPIError`` once SQLAlchemy is loaded, ``sqlite3.Error`` once
    ``sqlite3`` is (the read side on a SQLite file, ``runner.store.reader``) and
    ``psycopg.Error`` once psycopg is (on PostgreSQL, ``runner.store.pg_reader``); nothing
    raises them before, so ``flowrun --help`` and ``check`` import none of them."""
    found: tuple[type[Exception], ...] = ()
    for module, name in (
        ("sqlalchemy.exc", "DBAPIError"),
        ("sqlite3", "Error"),
        ("psycopg", "Error"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None:
            found += (getattr(loaded, name),)
    return found


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: runs the CLI and turns user mistakes into one line.

    Args:
        argv: the arguments after the program name (``None``: ``sys.argv[1:]``).

    Returns the exit code (0 ok, 1 unknown id or refused command, 2 bad flows, config or
    usage, an argument that is not UTF-8 text, or a read-only database, 75 the database
    failed mid-command, e.g. a full disk, 130 interrupted); raises nothing for user
    mistakes or database failures.
    """
    try:
        main_group.main(args=argv, prog_name="flowrun", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code if exc.exit_code else 2
    except FlowErrors as exc:
        for e in exc.errors:
            click.echo(literal(e, lines=True), err=True)
        return 2
    except (ConfigError, UserError) as exc:
        click.echo(f"flowrun: {literal(exc, lines=True)}", err=True)
        return exc.exit_code
    except UnicodeEncodeError as exc:  # an argument with bytes that are not UTF-8
        bad = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else ""
        byte = "".join(f"0x{ord(ch) - 0xDC00:02x}" for ch in bad if 0xDC80 <= ord(ch) <= 0xDCFF)
        click.echo(f"flowrun: an argument is not UTF-8 text (byte {byte or '?'})", err=True)
        return 2
    except _database_errors() as exc:  # failed mid-command: its transaction rolled back
        click.echo(f"flowrun: {literal(database_failure(exc), lines=True)}", err=True)
        return 2 if read_only_database(exc) else EXIT_DATABASE  # read-only: a set-up fault
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _version(ctx: click.Context, value: bool) -> None:
    """``--version``: flowrun's version and which spawn path runs ``exec`` handlers (the C
    extension or the Python fallback: ``runner.handlers.native``)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from runner.handlers.native import path_in_use

    click.echo(f"flowrun, version {version('flowrun')}")
    click.echo(f"exec handlers started by: {path_in_use()}")
    ctx.exit()
