"""Lifecycle alerts with 2 daemons on one PostgreSQL database (issue 30): every failing
instance is one event, delivered once to a real HTTP receiver, none doubled, none lost."""

from __future__ import annotations

import collections
import signal

import pytest

from runner.flowspec.compiler import load_flow
from runner.store.create import create_instances
from runner.store.db import make_engine
from tests.support.fault import Flowrun, poll, sql, write_flow
from tests.support.receiver import receiving

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(300)]

INSTANCES = 500

FLOW = """\
initial: work
defaults:
  error_budget: {max_errors: 1, window: 1h, on_exhausted: failed}
states:
  work: {exec: [sh, -c, "exit 3"], next: done}
  done: {terminal: true}
sensors:
  trouble: {lifecycle: {flows: [pgbad]}}
rules:
  - when: trouble
    webhook: {url: "URL/alert"}
"""


def test_two_daemons_one_delivery_per_failure(tmp_path, pg_url: str) -> None:
    fr = Flowrun(tmp_path)
    fr.db = pg_url
    with receiving() as rec:
        path = write_flow(fr.flows, "pgbad", FLOW.replace("URL", rec.url))
        engine = make_engine(pg_url)
        daemons = [
            fr.daemon("--concurrency", "8", worker_id=f"pg{w}", log=f"d{w}") for w in range(2)
        ]
        try:
            for d in daemons:
                poll(lambda d=d: "sensors ready" in d.log(), 60, what="hub ready")
            with engine.begin() as conn:
                create_instances(conn, load_flow(path), [{"i": i} for i in range(INSTANCES)])
            poll(lambda: len(rec.got()) >= INSTANCES, 240, what="every alert delivered")
            poll(
                lambda: (
                    sql(engine, "SELECT count(*) FROM deliveries WHERE status='delivered'")[0][0]
                    == INSTANCES
                ),
                60,
            )
        finally:
            for d in daemons:
                d.signal(signal.SIGINT)
            for d in daemons:
                d.wait(60)
                d.stop()
        got = rec.got()
    assert len(got) == INSTANCES  # none doubled (a repeat would be one more request)
    keys = collections.Counter(r.headers["Idempotency-Key"] for r in got)
    assert len(keys) == INSTANCES and max(keys.values()) == 1
    assert sorted(r.json()["instance"] for r in got) == sorted(
        i for (i,) in sql(engine, "SELECT id FROM instances")
    )
    assert sql(engine, "SELECT count(*) FROM events")[0][0] == INSTANCES
    assert sql(engine, "SELECT count(*), count(DISTINCT key) FROM events")[0] == (
        INSTANCES,
        INSTANCES,
    )
    # both daemons committed failures (the property is about several writers)
    by_worker = collections.Counter(
        p["worker"] for (p,) in sql(engine, "SELECT payload FROM events")
    )
    assert len(by_worker) == 2, by_worker
