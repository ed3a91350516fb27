"""Alerts benchmark (issue 30; not a test): how soon a transition reaches a webhook, and
what lifecycle events cost a busy daemon.

1. Latency: one ``flowrun --daemon`` (idle otherwise) runs a flow whose handler fails at
   once (error budget 1: the instance fails), with a ``lifecycle`` sensor and a
   ``webhook`` rule posting to an HTTP receiver (``bench/hook_receiver.py``: a process of its own
   on 127.0.0.1). Instances are created one at a time, every 0.2 s; latency = time the
   webhook arrived - the event's ``at`` (the transition's commit time). p50 / p99.
2. Webhook in: the same daemon kind with ``--http``, a ``webhook`` sensor (bearer token)
   and a rule starting a no-op ``call`` flow; requests are POSTed one at a time, every
   0.2 s; latency = the instance's first attempt started - the request sent. p50 / p99.
3. Cost: N instances of a no-op flow (two ``call`` states, then terminal) created at once
   in ONE ``flowrun --daemon`` whose sensor hub is ready (its start-up, up to
   ``HUB_AFTER`` s after the worker's first cycle, is not timed), without and with a
   lifecycle rule on ``completed`` that posts every completion to the receiver (HTTP/1.1,
   keep-alive, as a real receiver); rate = instances / (the daemon's work done - first
   attempt start), the work done being the last attempt's end and, with the rule, the
   last webhook received (each event received exactly once, checked); ratio with/without
   (goal >= 0.8), interleaved.

Usage: ``.venv/bin/python bench/alerts.py [--pg URL] [--n 2000] [--count 40] [--repeat 2]
[--parts transition,webhook,throughput] [--rule each|once_per]``
(``--rule once_per``: the throughput rule folds its webhooks, ``once_per: {key:
"{event.flow}", window: 1h}``: one is posted, every event is handled and counted on it;
the work done ends with the last event handled.)
(``--pg``: a PostgreSQL server URL such as ``postgresql://postgres@127.0.0.1:5432/postgres``;
a fresh database is made and dropped per run; default: a SQLite file).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hook_receiver import Receiver  # noqa: E402 - bench/, next to this file

FAIL = """\
flow: fail
initial: work
defaults: {error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}}
states:
  work: {exec: [/bin/false], next: done}
  done: {terminal: true}
sensors:
  trouble: {lifecycle: {flows: [fail]}}
rules:
  - {when: trouble, webhook: {url: "URL"}}
"""

NOOP = """\
flow: noop
initial: a
states:
  a: {call: "bench_noop:noop", next: b}
  b: {call: "bench_noop:noop", next: done}
  done: {terminal: true}
"""
RULE = """\
sensors:
  done_ev: {lifecycle: {flows: [noop], on: [completed]}}
rules:
  - {when: done_ev, webhook: {url: "URL"}}
"""
#: ``--rule once_per``: the same rule, its deliveries folded into one an hour per flow
FOLDED = RULE.replace('{url: "URL"}}', '{url: "URL"}, once_per: {key: "{event.flow}", window: 1h}}')


HOOKED = """\
flow: hooked
initial: a
states:
  a: {call: "bench_noop:noop", next: done}
  done: {terminal: true}
sensors:
  deploy: {webhook: {path: /hooks/deploy, token_env: BENCH_TOKEN}}
rules:
  - {when: deploy, start: hooked, data: {n: "{event.body.n}"}}
"""


@contextlib.contextmanager
def database(pg: str | None, folder: Path):
    """A fresh database URL (SQLite file in ``folder``, or a new PostgreSQL database)."""
    if pg is None:
        yield f"sqlite:///{folder / 'flowrun.db'}"
        return
    import psycopg

    name = f"alerts_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg.rpartition("/")[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name
    finally:
        with psycopg.connect(pg, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def flowrun(url: str, flows: Path, *args: str, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWRUN_")}
    env.update(FLOWRUN_DB=url, FLOWRUN_FLOWS=str(flows), PYTHONPATH=str(ROOT))
    exe = Path(sys.executable).with_name("flowrun")
    return subprocess.Popen([str(exe), *args], env=env, cwd=flows, start_new_session=True, **kw)


def latency(pg: str | None, count: int) -> list[float]:
    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instance
    from runner.store.db import make_engine

    rec = Receiver()
    with tempfile.TemporaryDirectory() as tmp, database(pg, Path(tmp)) as url:
        flows = Path(tmp) / "flows"
        flows.mkdir()
        (flows / "fail.yaml").write_text(FAIL.replace("URL", rec.url))
        engine = make_engine(url)
        log = open(Path(tmp) / "daemon.log", "wb")  # noqa: SIM115
        proc = flowrun(url, flows, "--daemon", stdout=log, stderr=log)
        try:
            _wait(lambda: b"sensors ready" in (Path(tmp) / "daemon.log").read_bytes(), 60)
            flow = load_flow(flows / "fail.yaml")
            for i in range(count):
                with engine.begin() as conn:
                    create_instance(conn, flow, {"i": i})
                _wait(lambda i=i: rec.count() > i, 30)
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            engine.dispose()
    import json

    out = []
    for arrived, _, body in rec.stop():
        at = datetime.fromisoformat(json.loads(body)["at"].replace("Z", "+00:00")).timestamp()
        out.append(arrived - at)
    return out


def webhook_in(pg: str | None, count: int) -> list[float]:
    """Seconds from a webhook request sent to its instance's first attempt started."""
    import http.client
    import json
    import re

    import sqlalchemy as sa

    from runner.store.db import make_engine

    with tempfile.TemporaryDirectory() as tmp, database(pg, Path(tmp)) as url:
        flows = Path(tmp) / "flows"
        flows.mkdir()
        (flows / "bench_noop.py").write_text("async def noop(ctx):\n    return True\n")
        (flows / "hooked.yaml").write_text(HOOKED)
        engine = make_engine(url)
        logfile = Path(tmp) / "daemon.log"
        log = open(logfile, "wb")  # noqa: SIM115
        os.environ["BENCH_TOKEN"] = "bench-token"
        proc = flowrun(url, flows, "--daemon", "--http", "0", stdout=log, stderr=log)
        out: list[float] = []
        steps: list[tuple[float, float, float]] = []
        try:
            _wait(lambda: b"sensors ready" in logfile.read_bytes(), 60)
            found = re.search(rb"http listener on http://[^:]+:(\d+)", logfile.read_bytes())
            assert found is not None, "no listener line"
            port = int(found.group(1))
            started = sa.text(
                "SELECT a.started_at, e.created_at, e.handled_at FROM attempts a"
                " JOIN instances i ON i.id = a.instance_id JOIN events e ON e.id = i.event_id"
                " WHERE i.event_id = :e AND a.attempt = 1"
            )
            for i in range(count):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                body = json.dumps({"n": i}).encode()
                headers = {"Authorization": "Bearer bench-token"}
                sent = time.time()
                conn.request("POST", "/hooks/deploy", body=body, headers=headers)
                res = conn.getresponse()
                assert res.status == 202, res.status
                event = json.loads(res.read())["event"]
                conn.close()
                got: list[Any] = []

                def ran(event: int = event, got: list[Any] = got) -> bool:
                    with engine.connect() as db:
                        row = db.execute(started, {"e": event}).first()
                    if row is not None:
                        got.append(row)
                    return row is not None

                _wait(ran, 30)
                at, stored, handled = (float(v) for v in got[0])
                out.append(at - sent)
                steps.append((stored - sent, handled - stored, at - handled))
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            engine.dispose()
    stored, handled, began = (statistics.median(col) * 1000 for col in zip(*steps, strict=True))
    print(f"  medians: request -> event stored {stored:.0f} ms, stored -> handled by the rules "
          f"{handled:.0f} ms, handled -> attempt started {began:.0f} ms")  # fmt: skip
    return out


def throughput(pg: str | None, n: int, with_rule: bool, folded: bool = False) -> float:
    """Instances a second one daemon, its hub ready, runs (and, ``with_rule``, alerts;
    ``folded``: with ``once_per``, one webhook for all, the rest counted on it)."""
    import sqlalchemy as sa

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    rec = Receiver()
    with tempfile.TemporaryDirectory() as tmp, database(pg, Path(tmp)) as url:
        flows = Path(tmp) / "flows"
        flows.mkdir()
        (flows / "bench_noop.py").write_text("async def noop(ctx):\n    return True\n")
        rule = (FOLDED if folded else RULE).replace("URL", rec.url)
        (flows / "noop.yaml").write_text(NOOP + (rule if with_rule else ""))
        engine = make_engine(url)
        logfile = Path(tmp) / "daemon.log"
        log = open(logfile, "wb")  # noqa: SIM115
        proc = flowrun(url, flows, "--daemon", stdout=log, stderr=log)
        completed = sa.text("SELECT count(*) FROM instances WHERE status = 'completed'")
        unhandled = sa.text("SELECT count(*) FROM events WHERE handled_at IS NULL")
        try:
            _wait(lambda: b"sensors ready" in logfile.read_bytes(), 60)  # start-up not timed
            with engine.begin() as conn:
                create_instances(conn, load_flow(flows / "noop.yaml"), [{"i": i} for i in range(n)])

            def done() -> bool:
                if with_rule and rec.count() < (1 if folded else n):
                    return False
                with engine.connect() as conn:
                    if with_rule and conn.execute(unhandled).scalar() != 0:
                        return False
                    return conn.execute(completed).scalar() == n

            _wait(done, 600, every=0.05)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        time.sleep(0.2)  # what a late duplicate would be
        got = rec.stop()
        with engine.connect() as conn:
            first, last = conn.execute(
                sa.text("SELECT min(started_at), max(finished_at) FROM attempts")
            ).one()
            events, handled, suppressed = conn.execute(
                sa.text(
                    "SELECT (SELECT count(*) FROM events), (SELECT max(handled_at) FROM events),"
                    " (SELECT sum(suppressed) FROM deliveries)"
                )
            ).one()
        engine.dispose()
    if with_rule and folded:  # one webhook; every event handled, folded into it
        assert len(got) == 1 and events == n and suppressed == n - 1, (len(got), events)
        return n / (max(last, handled, got[0][0]) - first)
    if with_rule:  # every alert arrived, exactly once; the daemon's work ends with the last
        assert len(got) == n, f"{len(got)} webhooks for {n} completions"
        keys = {key for _, key, _ in got}
        assert len(keys) == n, f"{n - len(keys)} webhooks received twice"
        last = max(last, max(at for at, _, _ in got))
    return n / (last - first)


def _wait(pred, timeout: float, every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(every)


def _report(what: str, seconds: list[float]) -> None:
    """One line: p50, p99 and max of ``seconds`` in ms."""
    lat = sorted(seconds)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"{what}, {len(lat)} samples: "
          f"p50 {statistics.median(lat) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {lat[-1] * 1000:.0f} ms")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", help="PostgreSQL server URL (default: SQLite)")
    ap.add_argument("--n", type=int, default=2000, help="instances per throughput run")
    ap.add_argument("--count", type=int, default=40, help="transitions timed for latency")
    ap.add_argument("--repeat", type=int, default=2, help="throughput runs of each kind")
    ap.add_argument(
        "--rule",
        choices=["each", "once_per"],
        default="each",
        help="throughput: the rule posts every completion, or folds them (once_per)",
    )
    ap.add_argument(
        "--parts", default="transition,webhook,throughput", help="which parts run (comma list)"
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    db = "PostgreSQL" if args.pg else "SQLite"
    if "transition" in parts:
        _report(f"{db}: transition -> webhook received", latency(args.pg, args.count))
    if "webhook" in parts:
        _report(f"{db}: webhook in -> instance started", webhook_in(args.pg, args.count))
    if "throughput" not in parts:
        return
    without, with_ = [], []
    for _ in range(args.repeat):  # interleaved
        without.append(throughput(args.pg, args.n, False))
        with_.append(throughput(args.pg, args.n, True, args.rule == "once_per"))
    a, b = max(without), max(with_)
    how = "each posted" if args.rule == "each" else "folded by once_per into one webhook"
    print(f"{db}: {args.n} no-op instances: {a:.0f}/s without a lifecycle rule, {b:.0f}/s "
          f"with one on completed ({how}); ratio {b / a:.2f} "
          f"(best of {args.repeat})")  # fmt: skip


if __name__ == "__main__":
    main()
