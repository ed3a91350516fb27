"""The ``flowrun`` subcommands about flow files themselves: ``check``, ``graph``, ``schema``.

Each is a standalone ``click`` command; ``runner.cli.main`` adds them (``COMMANDS``) to the
``flowrun`` group. A docstring's text after the form feed is not shown by ``--help``.
"""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.context import Ctx, pass_ctx
from runner.errors import ConfigError, FlowError, FlowErrors
from runner.literal import literal


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@pass_ctx
def check(c: Ctx, paths: tuple[Path, ...]):
    """Validate flows (the flows folder, or PATH files/folders): exit 0 valid, 2 invalid.

    A single FILE's cross-references (a rule's ``start: other_flow``) are resolved against
    the flows folder (--flows) and the file's own folder. A secret file that cannot be
    read now is a warning line (exit 0).

    \f
    Prints every error on stderr, one line each, then exits 2; else ``ok: N flows valid``.

    Raises:
        ConfigError: a PATH does not exist.
    """
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.compiler import PartialFlow, load_flow
    from runner.flowspec.registry import FlowRegistry
    from runner.flowspec.setup_checks import setup_warnings

    errors, warnings, count = [], [], 0
    for p in paths or (c.flows,):
        if p.is_dir():
            reg = FlowRegistry(p)
            errors += reg.load_all()
            count += len(reg.flows)
            for loaded in reg.flows.values():
                warnings += setup_warnings(loaded)
        elif p.exists():
            mine: list[FlowError] = []
            flow: CompiledFlow | PartialFlow | None
            try:
                flow = load_flow(p)
                count += 1
                warnings += setup_warnings(flow)
            except FlowErrors as exc:  # what still compiled is cross-checked too
                mine, flow = exc.errors, exc.partial
            if flow is not None:
                folders = [q for q in (p.parent, c.flows) if q.is_dir()]
                regs = [FlowRegistry(q) for q in {q.resolve(): q for q in folders}.values()]
                for reg in regs:
                    reg.load_all()
                mine += regs[0].check_alone(flow, *regs[1:])
            errors += sorted(mine, key=lambda e: (e.line or 0, e.col or 0))
        else:
            raise ConfigError(f"{p}: no such file or folder")

    for e in [*errors, *warnings]:
        click.echo(literal(e, lines=True), err=True)
    if errors:
        raise SystemExit(2)
    click.echo(f"ok: {count} flow{'s' if count != 1 else ''} valid")


@click.command()
@click.argument("flow")
@click.option(
    "--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid", show_default=True
)
@pass_ctx
def graph(c: Ctx, flow: str, fmt: str):
    """Print FLOW's state graph, from its compiled machine (on_exhausted moves too).

    \f
    Raises:
        ConfigError: the flows folder does not exist.
        UserError: no loaded flow is called FLOW (exit 2).
    """

    click.echo(literal(c.registry().get(flow).graph(fmt), lines=True))


@click.command()
def schema():
    """Print the JSON Schema of flow files.

    \f
    Raises nothing.
    """
    from runner.flowspec.schema import render

    click.echo(render(), nl=False)


COMMANDS = (check, graph, schema)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
