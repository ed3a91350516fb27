"""Hostile stored text for the console tests: a corpus of text that must be shown
literally (brackets read as markup, markup tags, ANSI and OSC sequences, NUL and other
controls, right-to-left marks, a 100 kB line, bytes that were not UTF-8), a function that
writes it into every place of a ``tests.support.console_db`` database the console shows,
and the screen reader the tests assert on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, update
from textual.worker import WorkerCancelled

from runner.store.tables import (
    attempt_logs,
    attempts,
    commands,
    events,
    flow_versions,
    instances,
    pools,
    sensors,
    workers,
)
from tests.support.console_db import NOW

#: Log lines and handler output of the issue: brackets that look like markup tags.
CACHE_LINE = "ERROR [cache] code=502 evicted [/var/lib/app] entries"
OPEN_FAILED = "open failed for [/var/lib/app/state.db]"
PAYMENTS = "[payments]"
RED_DISK = "[bold red]disk[/]"
ACTION_LINK = "[@click=app.quit]quit[/]"
ANSI = "\x1b[31mred\x1b[0m"
OSC_TITLE = "\x1b]0;pwned\x07"
OSC_LINK = "\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\"
CONTROLS = "a\x00b\x08c\x7fd\x9be\rf"
RTL = "abc\u202edcba\u202c \u200fx\u2066y\u2069"
BIG = "x" * 100_000
NOT_UTF8 = "caf\udce9 \udcff\udcfe"  # bytes 0xe9 0xff 0xfe kept by surrogateescape
#: Text that is not UTF-8 in a TEXT column (instance 3's label and last error).
RAW_LABEL = b"caf\xe9 [x]\xff"

#: A pool whose name (a flow's ``max_running`` key rendered from data) is hostile.
POOL = "flow:orders:" + PAYMENTS + OSC_TITLE + RTL

#: What instance 1's running attempt (3) wrote, as ``(stream, bytes)``: every kind of
#: trouble on its own line, a 100 kB line, bytes that are not UTF-8, a line cut in two.
LOG = [
    (1, CACHE_LINE.encode() + b"\n"),
    (2, (OPEN_FAILED + ANSI + OSC_TITLE + "\n").encode()),
    (1, (RED_DISK + " " + ACTION_LINK + OSC_LINK + "\n").encode()),
    (2, CONTROLS.encode() + b"\n"),
    (1, (RTL + "\n").encode()),
    (1, b"[long] " + BIG.encode() + b" [/end]\n"),
    (2, b"caf\xe9 \xff\xfe [x]"),
    (2, b" [/] \x1b[2J end\n"),
]

#: Every hostile string, by name.
CORPUS: dict[str, str] = {
    "cache_line": CACHE_LINE,
    "open_failed": OPEN_FAILED,
    "payments": PAYMENTS,
    "red_disk": RED_DISK,
    "action_link": ACTION_LINK,
    "ansi": ANSI,
    "osc_title": OSC_TITLE,
    "osc_link": OSC_LINK,
    "controls": CONTROLS,
    "rtl": RTL,
    "big": BIG,
    "not_utf8": NOT_UTF8,
}

#: Characters that must never reach the terminal: C0 (but none is allowed at all in a
#: screen line), DEL, C1, bidirectional and invisible format characters, surrogates.
RAW = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]"
)


def install(engine: Engine, flows_dir: Path) -> None:
    """Write the corpus into every kind of stored text the console shows: instance 1's
    data, label and last error, instance 2's label, instance 3's label and last error as
    bytes that are not UTF-8, its attempts' errors and
    checkpoint, a command's result, events (a tail sensor's line and file, a files
    sensor's path, keys and actions), a sensor's name and cursor, a worker's id and host,
    a stored flow version's flow and path, instance 1's running attempt's output
    (``LOG``), a pool's name (``POOL``), and flow files whose names and contents are
    hostile (shown as validation errors)."""
    with engine.begin() as conn:
        conn.execute(
            update(instances)
            .where(instances.c.id == 1)
            .values(data=dict(CORPUS), label=RED_DISK + ANSI, last_error=OPEN_FAILED + OSC_TITLE)
        )
        conn.execute(
            update(instances)
            .where(instances.c.id == 2)
            .values(label=PAYMENTS + CONTROLS, last_error=BIG + "\n" + CACHE_LINE)
        )
        conn.execute(update(instances).where(instances.c.id == 4).values(last_error=RTL + BIG))
        conn.exec_driver_sql(  # bytes that are not UTF-8, as another program could write
            "UPDATE instances SET label = CAST(? AS TEXT), last_error = CAST(? AS TEXT) "
            "WHERE id = 3",
            (RAW_LABEL, RAW_LABEL + b" [/]"),
        )
        conn.execute(
            update(attempts)
            .where(attempts.c.instance_id == 1, attempts.c.attempt == 1)
            .values(error=OPEN_FAILED + ANSI, worker=ACTION_LINK)
        )
        conn.execute(
            update(attempts)
            .where(attempts.c.instance_id == 1, attempts.c.attempt == 2)
            .values(checkpoint={"line": CACHE_LINE, "osc": OSC_LINK, "bad": NOT_UTF8})
        )
        conn.execute(
            insert(commands),
            {
                "instance_id": 1,
                "command": "send",
                "args": {"event": RED_DISK},
                "source": "rule",
                "created_at": NOW - 3,
                "status": "refused",
                "result": PAYMENTS + " " + ANSI + BIG,
            },
        )
        conn.execute(
            insert(events),
            [
                {
                    "sensor": "orders.app_log",
                    "key": "k" + ANSI,
                    "payload": {"line": CACHE_LINE, "file": "/var/log/[app].log", "code": "502"},
                    "created_at": NOW - 2,
                    "handled_at": NOW - 1,
                    "action": PAYMENTS + OSC_TITLE,
                },
                {
                    "sensor": "orders.app_log",
                    "key": "big",
                    "payload": {"line": BIG + RTL, "file": "/var/log/app.log"},
                    "created_at": NOW - 1,
                    "handled_at": None,
                    "action": None,
                },
                {
                    "sensor": "orders.inbox",
                    "key": "odd",
                    "payload": {"path": "/in/" + RED_DISK + CONTROLS, "name": "x", "size": 1},
                    "created_at": NOW - 1,
                    "handled_at": None,
                    "action": RTL,
                },
            ],
        )
        conn.execute(
            insert(sensors),
            {
                "name": "[sensor]" + OSC_TITLE,
                "cursor": {"x": CONTROLS, "y": NOT_UTF8},
                "locked_by": ACTION_LINK,
                "locked_until": NOW + 5,
                "updated_at": NOW - 1,
            },
        )
        conn.execute(
            insert(workers),
            {
                "id": "w[1]" + CONTROLS,
                "host": RTL,
                "pid": 1,
                "started_at": NOW - 60,
                "heartbeat_at": NOW - 1,
                "running": 0,
                "stopped_at": None,
            },
        )
        conn.execute(
            insert(flow_versions),
            {
                "version": "v" + ANSI,
                "flow": RED_DISK,
                "path": "/flows/" + PAYMENTS + OSC_LINK + ".yaml",
                "source": "",
                "loaded_at": NOW - 10,
            },
        )
        offset = 0
        rows = []
        for seq, (stream, data) in enumerate(LOG, 1):
            rows.append(
                {
                    "instance_id": 1,
                    "attempt": 3,
                    "seq": seq,
                    "stream": stream,
                    "at": NOW - 8 + seq / 10,
                    "offset": offset,
                    "data": data,
                }
            )
            offset += len(data)
        conn.execute(insert(attempt_logs), rows)
        conn.execute(insert(pools), {"name": POOL, "declared": 2, "slots": 1, "updated_at": 0})
    (flows_dir / f"{PAYMENTS}bad.yaml").write_text(f"flow: x\ninitial: a\nstates: {RED_DISK}\n")
    (flows_dir / "e\x1b[31mvil.yaml").write_bytes(b"flow: y\ninitial: a\x1b[2J\xff\n")


def screen_lines(app: Any) -> list[str]:
    """The text of every line of the app's screen as the terminal would get it (the
    compositor's strips: every widget, dialogs and notifications included)."""
    strips = app.screen._compositor.render_strips()
    return ["".join(seg.text for seg in strip) for strip in strips]


def assert_literal(app: Any, *fragments: str) -> str:
    """Assert that the screen holds no character the terminal must not get (``RAW``)
    and shows every fragment as it is; returns the screen's text (lines joined)."""
    lines = screen_lines(app)
    screen = "\n".join(lines)
    for number, line in enumerate(lines):
        found = RAW.search(line)
        assert found is None, f"raw U+{ord(found.group()):04X} on screen line {number}: {line!r}"
    missing = [f for f in fragments if f not in screen]
    assert not missing, f"not shown literally: {missing!r}\n{screen}"
    return screen


async def settle(app: Any, pilot: Any) -> None:
    """Let every thread worker of the console finish and its results reach the screen."""
    for _ in range(4):
        await pilot.pause()
        try:
            await app.workers.wait_for_complete()
        except WorkerCancelled:  # a live console: a refresh replaced an exclusive load
            pass
    await pilot.pause()


def assert_alive(app: Any) -> None:
    """The console is still running and met no exception."""
    assert app.is_running and app.return_code is None and app._exception is None
