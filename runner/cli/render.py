"""Human output of the CLI (``--json`` is the machine output): rich tables, no colour codes
when stdout is not a terminal."""

from __future__ import annotations

import json
import time
from datetime import datetime

from rich.console import Console
from rich.table import Table

_out = Console(highlight=False, soft_wrap=False)


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


def _due(r: dict) -> str:
    if r["due_at"]:
        return _ago(r["due_at"], future=True)
    return "event" if r["status"] in ("runnable", "paused") else "-"  # waits for an event


def instance_table(rows: list[dict]) -> None:
    """Print instances: id, flow, label (when any has one), state, status, attempts, errors,
    restarts, due, lock, error."""
    t = Table(box=None, pad_edge=False, header_style="bold")
    labels = any(r.get("label") for r in rows)
    for col in (
        "id",
        "flow",
        *(("label",) if labels else ()),
        "state",
        "status",
        "att",
        "err",
        "rst",
        "due in",
        "lock",
        "last error",
    ):
        t.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis",
            max_width={"last error": 60, "label": 30}.get(col),
            ratio=1 if col == "label" else None,  # the label shrinks before id and status
        )
    for r in rows:
        lock = (
            f"{r['locked_by']} ({_ago(r['locked_until'], future=True)})" if r["locked_by"] else "-"
        )
        t.add_row(
            str(r["id"]),
            r["flow"],
            *((r.get("label") or "",) if labels else ()),
            r["state"],
            r["status"],
            str(r["attempts"]),
            str(r["errors"]),
            str(r["restarts"]),
            _due(r),
            lock,
            (r.get("last_error") or "").splitlines()[0][:60] if r.get("last_error") else "",
        )
    _out.print(t)
    _out.print(f"{len(rows)} instance{'s' if len(rows) != 1 else ''}")


def instance_detail(item: dict) -> None:
    """Print one instance, its error budget, data, checkpoints and attempt history."""
    for key in (
        "id",
        "flow",
        "label",
        "version",
        "state",
        "status",
        "attempts",
        "errors",
        "restarts",
        "due_at",
        "locked_by",
        "locked_until",
        "created_at",
        "updated_at",
        "last_error",
    ):
        _out.print(f"[bold]{key:>13}[/bold]  {item.get(key) if item.get(key) is not None else '-'}")
    b = item.get("budget")
    if b:
        _out.print(
            f"[bold]{'error budget':>13}[/bold]  {b['used']} used, {b['left']} left of {b['max']} "
            f"in {b['window']:g}s (then {b['on_exhausted']}); "
            f"restarts {b['restarts']}/{b['max_restarts']}"
        )
    _out.print(f"[bold]{'data':>13}[/bold]  {json.dumps(item['data'])}")
    t = Table(title="attempts", box=None, header_style="bold", title_justify="left")
    for col in ("#", "state", "worker", "started", "secs", "outcome", "to", "error"):
        t.add_column(col, overflow="fold" if col == "error" else "ellipsis")
    for a in item["history"]:
        t.add_row(
            str(a["attempt"]),
            a["state"],
            a["worker"],
            a["started_at"] or "-",
            f"{a['duration']:.3f}" if a["duration"] is not None else "running",
            a["outcome"] or "-",
            a["to_state"] or "",
            (a["error"] or "")[:300],
        )
    _out.print(t)
    for cmd in item.get("commands", []):
        _out.print(
            f"command {cmd['command']} from {cmd['source']} at {cmd['at']}: "
            f"{cmd['status']}: {cmd['result']}"
        )


def events_table(rows: list[dict]) -> None:
    """Print sensor events and what the rules did."""
    t = Table(box=None, header_style="bold")
    for col in ("id", "sensor", "key", "created", "handled", "action"):
        t.add_column(col, overflow="ellipsis")
    for r in rows:
        t.add_row(
            str(r["id"]),
            r["sensor"],
            str(r["key"])[:50],
            r["created_at"] or "-",
            r["handled_at"] or "pending",
            r.get("action") or "",
        )
    _out.print(t)


def workers_table(rows: list[dict]) -> None:
    """Print workers with heartbeat age and running attempts."""
    t = Table(box=None, header_style="bold")
    for col in ("id", "host", "pid", "started", "heartbeat", "running", "state"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["id"],
            r["host"],
            str(r["pid"]),
            r["started_at"],
            _ago(r["heartbeat_at"]) + " ago",
            str(r["running"]),
            "stopped" if r["stopped_at"] else "alive",
        )
    _out.print(t)
