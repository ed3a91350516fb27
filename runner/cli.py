"""The ``flowrun`` command (the contract: ``shared/design/cli.md``).

Every user mistake — a bad flow, an unknown id, a bad URL, an unreachable database — is one
line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import click

from . import lifecycle, queries
from .commands import CommandResult, allowed_events, select_ids, submit
from .db import DEFAULT_URL, make_engine, reading
from .errors import ConfigError, FlowErrors, UserError
from .worker import WorkerConfig

EPILOG = """\b
Exit codes: 0 ok; 1 unknown id (or a refused command); 2 bad flows, config or usage.
Every option also reads its FLOWRUN_* variable (FLOWRUN_FLOWS, FLOWRUN_DB, FLOWRUN_LEASE).
"""


class Ctx:
    """What the global options resolve to; the engine is opened on first use."""

    def __init__(self, flows: Path, db: str, lease: float):
        self.flows, self.db, self.lease = flows, db, lease
        self._engine = None

    @property
    def engine(self):
        if self._engine is None:
            self._engine = make_engine(self.db)
        return self._engine

    def registry(self, *, strict: bool = False):
        """The flows folder loaded; with ``strict``, any error aborts (exit 2)."""
        from .flows import FlowRegistry

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
    help="Database URL: sqlite:///path or postgresql+psycopg://user@host/db.",
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
    default=8,
    show_default=True,
    envvar="FLOWRUN_CONCURRENCY",
    help="Attempts run at once by this worker.",
)
@click.option("--worker-id", envvar="FLOWRUN_WORKER_ID", help="Worker id (default host:pid).")
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
@click.version_option(package_name="flowrun")
@click.pass_context
def main_group(
    ctx, flows, db, lease, daemon, concurrency, worker_id, exit_when_idle, log_format, grace
):
    """flowrun: declarative YAML flows, persisted instances, an operator console.

    Without a command: `flowrun` opens the console (with an embedded worker);
    `flowrun --daemon` runs the headless worker.
    """
    ctx.obj = Ctx(flows, db, lease)
    ctx.obj.worker_options = dict(
        concurrency=concurrency,
        worker_id=worker_id,
        exit_when_idle=exit_when_idle,
        log_format=log_format,
        grace=grace,
    )
    if ctx.invoked_subcommand is None:
        if daemon:
            raise SystemExit(run_daemon(ctx.obj))
        ctx.invoke(tui)


def worker_config(c: Ctx) -> WorkerConfig:
    """The ``WorkerConfig`` the global options describe."""
    o = c.worker_options
    cfg = WorkerConfig(
        lease=c.lease,
        concurrency=o["concurrency"],
        grace=o["grace"],
        exit_when_idle=o["exit_when_idle"],
    )
    if o["worker_id"]:
        cfg.worker_id = o["worker_id"]
    return cfg


def run_daemon(c: Ctx) -> int:
    """Run the headless daemon until stopped; returns the exit code."""
    from .daemon import load_registry, serve, setup_logging

    setup_logging(c.worker_options["log_format"])
    log = logging.getLogger("flowrun.daemon")
    registry = load_registry(c.engine, c.flows) if c.flows.is_dir() else None
    if registry is None:
        raise ConfigError(f"{c.flows}: flows folder not found (set --flows or FLOWRUN_FLOWS)")
    log.info("loaded %d flows from %s", len(registry.flows), c.flows)
    worker = asyncio.run(serve(c.engine, registry, worker_config(c)))
    log.info("done: %s", ", ".join(f"{k} {v}" for k, v in worker.stats.items()))
    return 0


@main_group.command()
@click.option("--attach", is_flag=True, help="Observe and command only; run no worker here.")
@click.option("--readonly", is_flag=True, help="Refuse every command.")
@pass_ctx
def tui(c: Ctx, attach: bool, readonly: bool):
    """Open the operator console (with an embedded worker unless --attach)."""
    from .console import run_console

    run_console(c, attach=attach or readonly, readonly=readonly)


@main_group.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@pass_ctx
def check(c: Ctx, paths: tuple[Path, ...]):
    """Validate flows (the flows folder, or PATH files/folders): exit 0 valid, 2 invalid."""
    from .compiler import load_flow
    from .flows import FlowRegistry

    errors, count = [], 0
    for p in paths or (c.flows,):
        if p.is_dir():
            reg = FlowRegistry(p)
            errors += reg.load_all()
            count += len(reg.flows)
        elif p.exists():
            try:
                load_flow(p)
                count += 1
            except FlowErrors as exc:
                errors += exc.errors
        else:
            raise ConfigError(f"{p}: no such file or folder")
    for e in errors:
        click.echo(str(e), err=True)
    if errors:
        raise SystemExit(2)
    click.echo(f"ok: {count} flow{'s' if count != 1 else ''} valid")


def _parse_kv(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UserError(f"bad data argument {pair!r}: expected key=value", 2)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@main_group.command()
@click.argument("flow")
@click.argument("pairs", nargs=-1)
@click.option("--data", "data_json", help="Instance data as a JSON object.")
@pass_ctx
def start(c: Ctx, flow: str, pairs: tuple[str, ...], data_json: str | None):
    """Create an instance of FLOW (data from --data JSON and key=value pairs); prints its id."""
    from .store import create_instance

    data: dict = {}
    if data_json:
        try:
            data = json.loads(data_json)
        except json.JSONDecodeError as exc:
            raise UserError(f"--data: not valid JSON: {exc}", 2) from None
        if not isinstance(data, dict):
            raise UserError("--data must be a JSON object", 2)
    data.update(_parse_kv(pairs))
    compiled = c.registry().get(flow)
    with c.engine.begin() as conn:
        iid = create_instance(conn, compiled, data)
    click.echo(iid)


@main_group.command(name="ls")
@click.option("--flow")
@click.option(
    "--status",
    type=click.Choice(["runnable", "sleeping", "paused", "completed", "failed", "killed"]),
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--limit", type=int, default=None, help="At most this many (newest first).")
@pass_ctx
def ls_cmd(c: Ctx, flow, status, as_json, limit):
    """List instances."""
    rows = queries.list_instances(
        c.engine, flow=flow, status=status, limit=limit, order_by="id", desc=limit is not None
    )
    if limit is not None:
        rows.reverse()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from .render import instance_table

    instance_table(rows)


@main_group.command()
@click.argument("instance_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_ctx
def show(c: Ctx, instance_id: int, as_json: bool):
    """One instance with its attempts, errors, checkpoints and error budget."""
    item = queries.get_instance(c.engine, instance_id)
    if item is None:
        raise UserError(f"no instance {instance_id}", 1)
    if as_json:
        click.echo(json.dumps(item, indent=2))
        return
    from .render import instance_detail

    instance_detail(item)


def _command(c: Ctx, command: str, ids: tuple[int, ...], flow: str | None, event=None) -> None:
    if not ids and not flow:
        raise UserError(f"{command}: give instance ids or --flow F", 2)
    id_list = list(ids)
    if flow:  # every instance of the flow this command can act on (no refusal spam)
        with reading(c.engine) as conn:
            id_list += select_ids(conn, flow=flow, status=lifecycle.sources(command))
        if not id_list:
            done = {"pause": "paused", "resume": "resumed", "kill": "killed", "retry": "retried"}
            click.echo(f"no instance of flow {flow!r} can be {done[command]}")
            return
    results: list[CommandResult] = submit(c.engine, id_list, command, event=event, source="cli")
    code = 0
    for r in results:
        if r.ok:
            click.echo(r.message)
        else:
            click.echo(f"flowrun: {r.message}", err=True)
            code = 1
    if code:
        raise SystemExit(code)


def _make_command(name: str, help_text: str):
    @click.argument("ids", nargs=-1, type=int)
    @click.option("--flow", help="Every instance of this flow.")
    @pass_ctx
    def cmd(c: Ctx, ids, flow):
        _command(c, name, ids, flow)

    cmd.__doc__ = help_text
    main_group.command(name=name)(cmd)


_make_command("pause", "Pause instances (a running attempt is cancelled).")
_make_command("resume", "Resume paused or sleeping instances.")
_make_command("kill", "Kill instances (a running attempt is cancelled).")
_make_command("retry", "Retry failed instances (the state's counters reset).")


@main_group.command()
@click.argument("instance_id", type=int)
@click.argument("event")
@pass_ctx
def send(c: Ctx, instance_id: int, event: str):
    """Move an instance along an `on:` edge of its state (exit 2 if not allowed)."""
    results = submit(c.engine, [instance_id], "send", event=event, source="cli")
    r = results[0]
    if r.ok:
        click.echo(r.message)
        return
    click.echo(f"flowrun: {r.message}", err=True)
    if r.message.startswith("no instance"):
        raise SystemExit(1)
    events = allowed_events(c.engine, instance_id)
    if events and event not in events:
        click.echo(f"flowrun: events allowed here: {', '.join(events)}", err=True)
    raise SystemExit(2)


@main_group.command()
@click.argument("flow")
@click.option(
    "--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid", show_default=True
)
@pass_ctx
def graph(c: Ctx, flow: str, fmt: str):
    """Print FLOW's state graph, from its compiled machine."""
    click.echo(c.registry().get(flow).graph(fmt))


@main_group.command()
def schema():
    """Print the JSON Schema of flow files."""
    from .schema import render

    click.echo(render(), nl=False)


@main_group.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--limit", type=int, default=50, show_default=True)
@pass_ctx
def events(c: Ctx, as_json: bool, limit: int):
    """Recent sensor events and what the rules did with each."""
    from .sensors import list_events

    rows = list_events(c.engine, limit=limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from .render import events_table

    events_table(rows)


@main_group.command(name="workers")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def workers_cmd(c: Ctx, as_json: bool):
    """Workers with their heartbeats and running attempts."""
    rows = queries.list_workers(c.engine)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from .render import workers_table

    workers_table(rows)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: runs the CLI and turns user mistakes into one line."""
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
            click.echo(str(e), err=True)
        return 2
    except (ConfigError, UserError) as exc:
        click.echo(f"flowrun: {exc}", err=True)
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
