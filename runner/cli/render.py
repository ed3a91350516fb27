"""Human output of the CLI (``--json`` is the machine output): tables, no colour codes when
stdout is not a terminal.

Every stored or user text goes through ``runner.literal.literal`` before it is printed,
and rich prints with markup and emoji codes off: ``[bold]`` in a log line is shown as
``[bold]``, an escape sequence in a file name as ``\\x1b``."""

from __future__ import annotations

import functools
import json
import textwrap
import time
from datetime import datetime
from typing import Any

import click

from runner.cli.columns import clip, plain_table, terminal_width
from runner.error_line import error_line
from runner.labels import show
from runner.literal import literal, one_line
from runner.ops.views import INSTANCE_KEYS
from runner.tui import fmt


@functools.lru_cache(maxsize=1)
def _rich():
    """``(console, Table)``: rich, imported on first use (``ls`` needs none of it). The
    console reads no markup and no ``:emoji:`` codes in what it prints: every string is
    shown as it is (styles are given as ``style=``, never as markup)."""
    from rich.console import Console
    from rich.table import Table

    return Console(highlight=False, soft_wrap=False, markup=False, emoji=False), Table


def _ago(iso_ts: str | None, *, future: bool = False) -> str:
    if not iso_ts:
        return "-"
    ts = datetime.fromisoformat(iso_ts.replace("Z", "+00:00")).timestamp()
    delta = ts - time.time() if future else time.time() - ts
    sign = "" if delta >= 0 else "-"
    delta = abs(delta)
    if delta < 60:
        text = f"{delta:.1f}s"
    elif delta < 3600:
        text = f"{delta / 60:.1f}m"
    elif delta < 86400:
        text = f"{delta / 3600:.1f}h"
    else:
        text = f"{delta / 86400:.1f}d"
    return sign + text


def json_lines_array(items: list[Any]) -> str:
    """A JSON array with one item per line: valid JSON, readable, and written by the
    ``json`` module's C encoder (``indent`` falls back to its pure-Python encoder, which
    took 1.2 s for 10,000 instances)."""
    if not items:
        return "[]"
    return "[\n" + ",\n".join(map(json.dumps, items)) + "\n]"


#: The instance table's columns: (header, key, least width it shrinks to or ``None`` when
#: it never shrinks, rank in which it is dropped when even shrunk they do not fit, or
#: ``None`` when it always shows). ``id`` and ``status`` always show; by their value to an
#: operator the label and the last error go last, the counters and the lock first.
INSTANCE_COLUMNS: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("id", "id", None, None),
    ("flow", "flow", 8, 4),
    ("label", "label", None, 8),
    ("state", "state", 8, 6),
    ("status", "status", None, None),
    ("att", "attempts", None, 2),
    ("err", "errors", None, 3),
    ("rst", "restarts", None, 1),
    ("due in", "due", None, 5),
    ("lock", "lock", 8, 0),
    ("last error", "last_error", 20, 7),
)
#: The order in which the columns left shrink (down to their least width) when they do
#: not fit at their natural width. A label (at most ``LABEL_WIDTH`` cells) is never cut:
#: two labels cut to the same prefix tell nothing apart.
SHRINK_ORDER = ("lock", "flow", "last_error", "state")
#: The widest a ``last error`` cell gets.
LAST_ERROR_WIDTH = 60
#: The most of an event's ``what`` (its line, its file) ``events`` shows.
EVENT_WHAT_WIDTH = 200
#: The widest a ``label`` cell gets.
LABEL_WIDTH = 30


def waiting(events: tuple[str, ...] | list[str]) -> str:
    """What an instance waiting for an ``on:`` event is due on: ``on release|discard``
    (``on event`` when its state accepts none)."""
    return "on " + ("|".join(literal(e) for e in events) or "event")


def instance_table(
    rows: list[dict[str, Any]],
    *,
    width: int | None = None,
    waits: dict[int, tuple[str, ...]] | None = None,
) -> None:
    """Print instances (``runner.ops.queries.read_instances`` rows with ``TABLE_KEYS``,
    times in epoch seconds): id, flow, label (when any has one), state, status, attempts,
    errors, restarts, due, lock, last error, fitted to ``width`` cells (default: the
    terminal's, or ``COLUMNS``, or 80 when piped). ``id`` and ``status`` always show; the
    other columns shrink, then drop (the lock and the counters first, the label last);
    the label and last error columns show only when some row has one (an empty one's
    room goes to the due column: ``on release|discard`` shows at 80 columns).
    ``waits`` (``runner.ops.queries.waiting_events``) names the events an instance in an
    external state waits for: its due cell says ``on release|discard``. Stored text is
    shown literally (``runner.literal``).

    Plain text built here (a rich ``Table`` took 16 s for 10,000 rows); the header is
    bold on a terminal.
    """
    width = terminal_width(width)
    now = time.time()
    waits = waits or {}
    cells = []
    for r in rows:
        running = r.get("running_attempt") is not None
        due = fmt.due_in(r["due_at"], now, r["status"], running=running)
        if due == "event" and r["id"] in waits:
            due = waiting(waits[r["id"]])
        if r.get("waiting_for") and r["due_at"] is None:  # ``store.pools``: not due
            due = f"pool {literal(r['waiting_for'])}"
        cells.append(
            {
                "id": str(r["id"]),
                "flow": literal(r["flow"]),
                "label": clip(literal(r.get("label")), LABEL_WIDTH),
                "state": literal(r["state"]),
                "status": r["status"],
                "attempts": str(r["attempts"]),
                "errors": str(r["errors"]),
                "restarts": str(r["restarts"]),
                "due": due or "-",
                "lock": literal(fmt.lock(r["locked_by"], r["locked_until"], now)) or "-",
                "last_error": literal(error_line(r.get("last_error"), LAST_ERROR_WIDTH)),
            }
        )
    table = INSTANCE_COLUMNS
    for key in ("label", "last_error"):  # a label or error column only where some row has one
        if not any(c[key] for c in cells):
            table = tuple(col for col in table if col[1] != key)
    lines = plain_table(table, cells, width, SHRINK_ORDER)
    lines.append(f"{len(rows)} instance{'s' if len(rows) != 1 else ''}")
    click.echo("\n".join(lines))


#: ``show``'s attempts table (``INSTANCE_COLUMNS``-shaped): the number and the outcome
#: always show; a start time is never cut (``2026-11-27T…`` says nothing), it drops.
ATTEMPT_COLUMNS: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("#", "attempt", None, None),
    ("state", "state", 8, 4),
    ("worker", "worker", 8, 1),
    ("started", "started", None, 3),
    ("secs", "secs", None, 2),
    ("outcome", "outcome", None, None),
    ("to", "to", 8, 0),
    ("error", "error", 16, 5),
)
#: The order in which the attempts table's columns shrink.
ATTEMPT_SHRINK = ("worker", "to", "state", "error")

#: The fields ``show`` prints first, one a line: an instance's (data comes later), with
#: its flow version after its label.
DETAIL_KEYS = (*INSTANCE_KEYS[:3], "version", *(k for k in INSTANCE_KEYS[3:] if k != "data"))


def _fields(Table):
    """A two-column grid: keys bold and right-aligned, values folded under each other."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(justify="right", style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


def _field(grid, key: str, value: object, *, lines: bool = False) -> None:
    """Add ``key`` and ``value`` shown literally (``-`` for ``None``) to ``grid``."""
    grid.add_row(key, "-" if value is None else literal(value, lines=lines))


def instance_detail(item: dict[str, Any]) -> None:
    """Print one instance (``runner.ops.detail.get_instance``): its fields, what it waits
    for, its error budget, data, checkpoints, attempt history and commands. Stored text
    (label, data, errors, commands' results) is shown literally. The attempts table has
    an ``error`` column only when some attempt has an error (its room goes to the rest:
    a state moved to is not cut to ``quarant…``)."""
    out, Table = _rich()
    grid = _fields(Table)
    for key in DETAIL_KEYS:
        _field(grid, key, item.get(key))
    if item.get("waits_for") is not None:
        events = item["waits_for"]
        sends = ", ".join(f"flowrun send {item['id']} {literal(e)}" for e in events)
        _field(grid, "waits for", f"an event: {sends}" if events else "an event (none accepted)")
    _field(grid, "last_error", item.get("last_error"), lines=True)
    b = item.get("budget")
    if b:
        _field(
            grid,
            "error budget",
            f"{b['used']} used, {b['left']} left of {b['max']} in {b['window']:g}s "
            f"(then {b['on_exhausted']}); restarts {b['restarts']}/{b['max_restarts']}",
        )
    _field(grid, "data", json.dumps(item["data"]))
    out.print(grid)
    if item.get("history_pruned_before"):
        click.echo(f"attempts before {item['history_pruned_before']} pruned (retention)")
    if item["history"]:
        width = terminal_width()
        cells = [
            {
                "attempt": str(a["attempt"]),
                "state": literal(a["state"]),
                "worker": literal(a["worker"]),
                "started": a["started_at"] or "-",
                "secs": f"{a['duration']:.3f}" if a["duration"] is not None else "running",
                "outcome": a["outcome"] or "-",
                "to": literal(a["to_state"]),
                "error": literal(error_line(a["error"], 300)),
            }
            for a in item["history"]
        ]
        table = ATTEMPT_COLUMNS
        if not any(c["error"] for c in cells):  # no error to show: its room goes to the rest
            table = tuple(col for col in table if col[1] != "error")
        click.echo("attempts")
        click.echo("\n".join(plain_table(table, cells, width, ATTEMPT_SHRINK)))
        for a in item["history"]:  # the whole kept tail of each attempt's error
            if a["error"]:
                click.echo(f"error of attempt {a['attempt']}:")
                click.echo(textwrap.indent(literal(a["error"], lines=True), "  "))
                click.echo(f"  full output: flowrun logs {item['id']} --attempt {a['attempt']}")
        click.echo(f"each attempt's output (stored in the database): flowrun logs {item['id']}")
    named = {a["state"]: (a.get("env"), a.get("secrets")) for a in item["history"]}
    for state, (env, secrets) in named.items():
        if env or secrets:  # names only: a secret's value is never shown
            click.echo(
                f"handler of {literal(state)} gets env: {', '.join(env) or '-'}; "
                f"secrets: {', '.join(secrets) or '-'}"
            )
    for cp in item.get("checkpoints", []):
        out.print(
            f"checkpoint of attempt {cp['attempt']} in {literal(cp['state'])}: "
            f"{json.dumps(cp['checkpoint'], sort_keys=True)}"
        )
    for cmd in item.get("commands", []):
        out.print(
            f"command {literal(cmd['command'])} from {literal(cmd['source'])} at {cmd['at']}: "
            f"{cmd['status']}: {literal(cmd['result'])}"
        )


#: The events table's columns (``INSTANCE_COLUMNS``-shaped): what happened never drops;
#: the handling delay drops first.
EVENT_COLUMNS: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("id", "id", None, None),
    ("sensor", "sensor", 12, 2),
    ("what", "what", 24, None),
    ("created", "created", None, 1),
    ("handled", "handled", None, 0),
    ("action", "action", 16, 3),
)
#: The order in which the events table's columns shrink: the line (what happened) before
#: the sensor, whose name tells two sensors of one flow apart (``csv_ingest.…`` does not).
EVENT_SHRINK = ("action", "what", "sensor")


def _handled(created: str | None, handled: str | None) -> str:
    """``pending``, or how long after it was stored the rules handled an event (``+12ms``)."""
    if handled is None:
        return "pending"
    if created is None:
        return handled
    delay = datetime.fromisoformat(handled.replace("Z", "+00:00")) - datetime.fromisoformat(
        created.replace("Z", "+00:00")
    )
    return "+" + fmt.span(delay.total_seconds())


def events_table(rows: list[dict[str, Any]], *, width: int | None = None) -> None:
    """Print sensor events (``runner.ops.queries.list_events``): id, sensor, what
    happened (the line, the file; one line), when it was stored, how long after the rules
    handled it (or ``pending``) and what they did, shown literally and fitted to
    ``width`` cells (default: the terminal's, or ``COLUMNS``, or 80 when piped): the
    action, what happened and the sensor shrink, in that order (``EVENT_SHRINK``), then
    the handling delay, the time, the sensor and the action drop; the id and what
    happened always show."""
    width = terminal_width(width)
    cells = [
        {
            "id": str(r["id"]),
            "sensor": literal(r["sensor"]),
            "what": literal(r.get("what"))[:EVENT_WHAT_WIDTH],
            "created": r["created_at"] or "-",
            "handled": _handled(r["created_at"], r["handled_at"]),
            "action": one_line(r.get("action")),
        }
        for r in rows
    ]
    lines = plain_table(EVENT_COLUMNS, cells, width, EVENT_SHRINK)
    sent = [d for r in reversed(rows) for d in r.get("deliveries") or ()]
    if sent:
        lines += ["", "Deliveries (exec and webhook actions):"]
        lines += [delivery_line(d) for d in sent]
    click.echo("\n".join(lines))


def delivery_line(d: dict[str, Any]) -> str:
    """One line for a delivery (``runner.ops.queries.event_deliveries``): ``event 12
    delivery 4 webhook POST http://...: delivered at T after 1 try (HTTP 200), 99
    suppressed`` (``runner.tui.fmt.delivery_text``); stored text shown literally."""
    return f"  event {d['event_id']} delivery {d['id']} {literal(fmt.delivery_text(d))}"


#: The workers table's columns (``INSTANCE_COLUMNS``-shaped): the id, the heartbeat and
#: the verdict always show; the start time drops first.
WORKER_COLUMNS: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("id", "id", 16, None),
    ("host", "host", 8, 4),
    ("labels", "labels", 10, 5),
    ("pid", "pid", None, 3),
    ("started", "started", None, 0),
    ("heartbeat", "heartbeat", None, None),
    ("running", "running", None, 2),
    ("leases", "leases", None, 1),
    ("state", "state", None, None),
)


def workers_table(rows: list[dict[str, Any]], *, width: int | None = None) -> None:
    """Print workers (``runner.ops.liveness.list_workers``) with heartbeat age, running
    attempts, valid leases, the liveness verdict (alive/late/dead/stopped) and the labels
    (``gpu=1,host=a``), fitted to
    ``width`` cells (default: the terminal's, or ``COLUMNS``, or 80 when piped); ids and
    hosts shown literally."""
    width = terminal_width(width)
    cells = [
        {
            "id": literal(r["id"]),
            "host": literal(r["host"]),
            "pid": str(r["pid"]),
            "started": r["started_at"] or "-",
            "heartbeat": _ago(r["heartbeat_at"]) + " ago",
            "running": str(r["running"]),
            "leases": str(r["leases"]),
            "state": r["verdict"],
            "labels": literal(show(r.get("labels") or {})) or "-",
        }
        for r in rows
    ]
    click.echo("\n".join(plain_table(WORKER_COLUMNS, cells, width, ("host", "id", "labels"))))


POOL_COLUMNS: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("pool", "name", 8, None),
    ("slots", "slots", None, None),
    ("in use", "in_use", None, None),
    ("rate", "rate", None, 2),
    ("waiting", "waiting", None, 1),
    ("held by", "holders", 8, 0),
)


def _set_mark(pool: dict[str, Any]) -> str:
    """``*`` after a pool's slots when an operator set them."""
    return "" if pool["set"] is None else "*"


def pools_table(rows: list[dict[str, Any]], *, width: int | None = None) -> None:
    """Print pools (``runner.ops.pools.read_pools``): slots in force (``*`` after a
    number an operator set), slots in use, instances waiting, the holders' instance ids;
    names shown literally."""
    width = terminal_width(width)
    cells = [
        {
            "name": literal(r["name"]),
            "slots": "-" if r["slots"] is None else f"{r['slots']}{_set_mark(r)}",
            "rate": f"{r['rate']} ({r['recent_starts']} now)" if r["rate"] else "-",
            "in_use": str(r["in_use"]),
            "waiting": str(r["waiting"]),
            "holders": ", ".join(str(i) for i in r["holders"]) or "-",
        }
        for r in rows
    ]
    click.echo("\n".join(plain_table(POOL_COLUMNS, cells, width, ("holders", "name"))))
