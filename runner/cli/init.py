"""``flowrun init [DIR]``: a first flow to run, edit and learn from.

Writes ``DIR/flows/hello.yaml`` (a commented example whose first line points editors at
the JSON Schema), ``DIR/flows/hello_tasks.py`` (its ``call`` handler), ``DIR/flows/inbox/``
(the folder its sensor watches) and ``DIR/schemas/flow.schema.json`` (the schema of this
flowrun), then prints what to run next. Refuses (exit 2) when ``DIR/flows`` already holds a
flow file, so nothing of the user's is ever overwritten.
"""

from __future__ import annotations

from pathlib import Path

import click

from runner.errors import UserError

EXAMPLE_FLOW = """\
# yaml-language-server: $schema=../schemas/flow.schema.json
#
# hello: a first flow. Each *.txt file dropped into flows/inbox/ starts an instance that
# greets it (hello_tasks.py, next to this file), then waits for an operator to approve
# or reject it. Every key is described in docs/flows.md; `flowrun check` validates this
# file, `flowrun graph hello` draws it.
flow: hello
description: Greet each text file dropped into inbox/, then wait for approval.
label: "{data.path}"            # names each instance in `flowrun ls` and the console
initial: greet
data: {greeting: hello}         # default data, merged under each new instance's data

defaults:
  timeout: 1m                   # an attempt running longer is killed and restarted
                                # (max_restarts, default 5, then the instance fails)
  error_budget: {max_errors: 3, window: 1h, on_exhausted: failed}
  backoff: {initial: 5s, factor: 2, max: 5m}   # delay between retries after errors

states:
  greet:
    call: hello_tasks:greet     # module:function, imported from this folder
    next: review                # where the handler goes when it returns True
  review:
    external: true              # no handler: moved by `flowrun send ID approve`
    on: {approve: done, reject: done}
  done: {terminal: true}

sensors:
  inbox: {files: {path: inbox, glob: "*.txt"}}   # each new file once (path + inode)

rules:
  - when: inbox                 # an event of the inbox sensor ...
    start: hello                # ... starts an instance of this flow
    data: {path: "{event.path}"}   # event fields of a files sensor: path, name, size
"""

EXAMPLE_TASKS = '''\
"""``call`` handlers of the ``hello`` flow (see docs/handlers.md).

A handler takes flowrun's context (``ctx.data``: the instance's data, saved when the
handler returns; ``ctx.checkpoint(dict)``, ``ctx.keepalive()``) and returns a state's
name (move there), True (follow ``next:``) or None ("not yet": tried again after
``try_interval``). Raising is an error: retried with backoff until the state's error
budget is spent.
"""

from pathlib import Path


def greet(ctx):
    """Read the dropped file and remember a greeting for it in the instance's data."""
    path = Path(ctx.data.get("path") or "nothing")
    words = len(path.read_text(encoding="utf-8").split()) if path.is_file() else 0
    ctx.data["message"] = f"{ctx.data.get('greeting', 'hello')} {path.name} ({words} words)"
    return True
'''


def _has_flows(folder: Path) -> bool:
    return folder.is_dir() and any(
        p.suffix in (".yaml", ".yml") for p in folder.iterdir() if p.is_file()
    )


@click.command()
@click.argument("directory", required=False, default=".", type=click.Path(path_type=Path))
def init(directory: Path):
    """Create DIR/flows/ with a commented example flow and its handler (exit 2 if DIR
    already has flows).

    \f
    Raises:
        UserError: ``DIR/flows`` already holds a flow file (exit 2), or a file cannot be
            written (exit 2).
    """
    from runner.flowspec.schema import render

    flows = directory / "flows"
    if _has_flows(flows):
        raise UserError(f"{flows} already has flows: nothing written (try `flowrun check`)", 2)
    files = {
        flows / "hello.yaml": EXAMPLE_FLOW,
        flows / "hello_tasks.py": EXAMPLE_TASKS,
        directory / "schemas" / "flow.schema.json": render(),
    }
    try:
        (flows / "inbox").mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".json" and path.exists():
                continue  # a schema already there (e.g. flowrun's own checkout) stays
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {directory}: {exc}", 2) from None
    where = "" if directory == Path(".") else f"cd {directory} && "
    click.echo(f"created {flows}/hello.yaml, hello_tasks.py and inbox/")
    click.echo(
        f"next: {where}flowrun --daemon   (then, in another terminal: "
        "echo hi > flows/inbox/a.txt; flowrun ls)"
    )


COMMANDS = (init,)
"""The commands of this module, for ``runner.cli.main`` to add to the ``flowrun`` group."""
