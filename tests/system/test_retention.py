"""Retention (``runner.ops.prune``, ``runner.store.prune``) on real databases.

Instances are made and driven to their statuses by flowrun's own code (a real worker
running call handlers, real commands), on a SQLite file and on PostgreSQL; each prune
is given its ``now``, so the windows are seconds and nothing sleeps for them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text

from runner.engine.config import WorkerConfig
from runner.flowspec.registry import FlowRegistry
from runner.ops import prune as ops_prune
from runner.ops.commands import submit
from runner.ops.prune import Pacing, prune, rules_for
from runner.retention import parse_retention
from runner.sensors.events import record_events
from runner.sensors.rules import RuleEngine
from runner.service.daemon import serve
from runner.store import migrate, prune_instances
from runner.store.create import create_instance
from runner.store.db import make_engine
from runner.store.log_writer import flush_all
from runner.store.tables import attempts, commands, events, flow_versions, instances, workers
from runner.tui.data import ConsoleData
from tests.support.fault import unique, write_flow

pytestmark = pytest.mark.timeout(240)

HANDLERS = """
def route(ctx):
    return {"ok": "done", "fail": "bad", "wait": "wait", "kill": "wait"}[ctx.data["kind"]]


def boom(ctx):
    raise RuntimeError("boom")
"""

BODY = """initial: a
{retention}
states:
  a: {{call: "{mod}:route", to: [done, bad, wait]}}
  bad: {{call: "{mod}:boom", next: done, error_budget: {{max_errors: 1}}}}
  wait: {{external: true, on: {{go: done}}}}
  done: {{terminal: true}}
sensors:
  tick: {{every: 1h}}
rules:
  - when: tick
    start: {name}
    data: {{kind: ok}}
"""


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flowrun.db'}"
    return request.getfixturevalue("pg_url")


class World:
    """Two flows in a real flows folder on one database: ``keep`` (its file keeps
    completed instances forever, failed ones 30 s) and ``plain`` (no retention key)."""

    def __init__(self, tmp: Path, url: str) -> None:
        self.engine = make_engine(url)
        self.url = url
        mod = unique("ret_mod")
        self.keep, self.plain = unique("keep"), unique("plain")
        folder = tmp / "flows"
        for name, ret in (
            (self.keep, "retention: {completed: forever, failed: 30s}"),
            (self.plain, ""),
        ):
            body = BODY.format(retention=ret, mod=mod, name=name)
            write_flow(folder, name, body, {mod: HANDLERS} if name == self.keep else None)
        self.registry = FlowRegistry(folder)
        assert self.registry.load_all() == []

    def start(self, flow: str, kind: str, n: int = 1, event_id: int | None = None) -> list[int]:
        with self.engine.begin() as conn:
            f = self.registry.get(flow)
            return [create_instance(conn, f, {"kind": kind}, event_id=event_id) for _ in range(n)]

    def run_until_idle(self) -> None:
        cfg = WorkerConfig(worker_id=unique("w"), lease=10, exit_when_idle=True, concurrency=16)
        coro = serve(self.engine, self.registry, cfg, install_signals=False, sensors=False)
        asyncio.run(asyncio.wait_for(coro, 120))
        flush_all()  # every attempt's log rows stored, as at exit

    def statuses(self) -> dict[int, str]:
        with self.engine.connect() as conn:
            return dict(conn.execute(text("SELECT id, status FROM instances")).all())

    def count(self, table) -> int:
        with self.engine.connect() as conn:
            return conn.execute(text(f"SELECT count(*) FROM {table.name}")).scalar_one()

    def newest_change(self) -> float:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT max(updated_at) FROM instances")).scalar_one()

    def populate(self) -> dict[str, dict[str, list[int]]]:
        """Instances of each flow: completed, failed, killed and one waiting (live)."""
        out: dict[str, dict[str, list[int]]] = {}
        for flow in (self.keep, self.plain):
            out[flow] = {
                "completed": self.start(flow, "ok", 3),
                "failed": self.start(flow, "fail", 2),
                "killed": self.start(flow, "kill", 2),
                "live": self.start(flow, "wait", 1),
            }
        self.run_until_idle()
        for flow in out:
            res = submit(self.engine, out[flow]["killed"], "kill")
            assert all(r.ok for r in res), res
        got = self.statuses()
        for flow, groups in out.items():
            for status, ids in groups.items():
                want = "runnable" if status == "live" else status
                assert {got[i] for i in ids} == {want}, (flow, status, got)
        return out

    def close(self) -> None:
        self.engine.dispose()


@pytest.fixture
def world(tmp_path, db_url):
    w = World(tmp_path, db_url)
    yield w
    w.close()


FAST = Pacing(rest=0.0, min_rest=0.0)


def test_retention_per_status_and_per_flow(world: World) -> None:
    groups = world.populate()
    default = parse_retention("completed=10s,failed=forever,killed=20s")
    rules = rules_for(world.registry.flows.values(), default)
    t = world.newest_change()
    before = world.statuses()
    assert prune(world.engine, rules, now=t + 5, pacing=FAST)["instances"] == 0
    assert world.statuses() == before  # all younger than every window
    counts = prune(world.engine, rules, now=t + 40, pacing=FAST)
    left = world.statuses()
    keep, plain = groups[world.keep], groups[world.plain]
    # plain: the daemon's default (completed 10 s, failed forever, killed 20 s)
    assert not any(i in left for i in plain["completed"] + plain["killed"])
    assert all(i in left for i in plain["failed"] + plain["live"])
    # keep: its file (completed forever, failed 30 s), killed from the default (20 s)
    assert all(i in left for i in keep["completed"] + keep["live"])
    assert not any(i in left for i in keep["failed"] + keep["killed"])
    gone = plain["completed"] + plain["killed"] + keep["failed"] + keep["killed"]
    assert counts["instances"] == len(gone) == 3 + 2 + 2 + 2
    with world.engine.connect() as conn:
        owners = set(conn.execute(text("SELECT DISTINCT instance_id FROM attempts")).scalars())
        owners |= set(conn.execute(text("SELECT DISTINCT instance_id FROM commands")).scalars())
    assert not owners & set(gone)  # their attempts and commands went with them
    assert set(keep["completed"]) <= owners and set(plain["failed"]) <= owners
    # a kill is one command row; every instance made >= 1 attempt, failed ones 1 error each
    assert counts["commands"] == 4
    # "logs": the attempts that carried an error or a stored log (one that wrote nothing
    # stores no log row: the failed ones count, by their error)
    assert counts["attempts"] >= len(gone) and 0 < counts["logs"] <= counts["attempts"]
    with world.engine.connect() as conn:
        logged = set(conn.execute(text("SELECT instance_id FROM attempt_logs")).scalars())
    assert not logged & set(gone)
    # the live instance is never deleted, whatever its age
    counts = prune(world.engine, rules, now=t + 10**9, pacing=FAST)
    assert set(keep["live"] + plain["live"] + keep["completed"]) <= set(world.statuses())


def test_locked_and_changed_rows_are_kept(world: World, monkeypatch) -> None:
    groups = world.populate()
    failed = groups[world.plain]["failed"]
    done = groups[world.plain]["completed"]
    rules = rules_for(world.registry.flows.values(), parse_retention("1s"))
    t = world.newest_change()
    with world.engine.begin() as conn:  # as if a worker held it (a lease not yet released)
        conn.execute(text("UPDATE instances SET locked_by = 'w9' WHERE id = :i"), {"i": done[0]})
    real = prune_instances.candidates

    def retried_meanwhile(engine, flow, status, cutoff, after, limit):
        rows = real(engine, flow, status, cutoff, after, limit)
        if status == "failed" and any(r[0] == failed[0] for r in rows):
            # between the pruner's read and its delete an operator retries the instance
            assert submit(engine, [failed[0]], "retry")[0].ok
        return rows

    monkeypatch.setattr(prune_instances, "candidates", retried_meanwhile)
    prune(world.engine, rules, now=t + 100, pacing=FAST, flow=world.plain)
    left = world.statuses()
    assert left[failed[0]] == "runnable"  # revived: kept
    assert failed[1] not in left
    assert done[0] in left and not any(i in left for i in done[1:])


@pytest.mark.postgres
def test_row_locked_by_another_transaction_is_skipped(tmp_path, pg_url) -> None:
    w = World(tmp_path, pg_url)
    try:
        groups = w.populate()
        target = groups[w.plain]["completed"][0]
        rules = rules_for(w.registry.flows.values(), parse_retention("1s"))
        t = w.newest_change()
        other = make_engine(pg_url)
        with other.begin() as conn:
            conn.execute(text("SELECT id FROM instances WHERE id = :i FOR UPDATE"), {"i": target})
            prune(w.engine, rules, now=t + 100, pacing=FAST, flow=w.plain)
            assert target in w.statuses()  # skipped while locked, no wait
        prune(w.engine, rules, now=t + 100, pacing=FAST, flow=w.plain)
        assert target not in w.statuses()
        other.dispose()
    finally:
        w.close()


@pytest.mark.postgres
def test_two_pruners_on_postgresql_prune_each_row_once(tmp_path, pg_url) -> None:
    w = World(tmp_path, pg_url)
    try:
        w.start(w.plain, "kill", 1)  # a live instance
        ids = w.start(w.plain, "wait", 300)
        w.run_until_idle()
        assert all(r.ok for r in submit(w.engine, ids, "kill"))
        rules = rules_for(w.registry.flows.values(), parse_retention("1s"))
        t = w.newest_change()
        engines = [make_engine(pg_url) for _ in range(2)]
        seen: list[Counter] = [Counter(), Counter()]
        small = Pacing(batch=7, rest=0.0, min_rest=0.0)

        def one(i: int) -> None:
            prune(engines[i], rules, now=t + 100, pacing=small, on_step=seen[i].update)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert seen[0]["instances"] + seen[1]["instances"] == 300
        assert seen[0]["commands"] + seen[1]["commands"] == 300  # one kill each, counted once
        assert len(w.statuses()) == 1
        for e in engines:
            e.dispose()
    finally:
        w.close()


def test_pruner_lease_one_daemon_at_a_time(tmp_path, db_url) -> None:
    from runner.service.pruner import Pruner

    w = World(tmp_path, db_url)
    try:
        a = Pruner(w.engine, w.registry, "wa", 30.0)
        b = Pruner(w.engine, w.registry, "wb", 30.0)
        assert a.round() is not None
        assert b.round() is None  # a holds the lease
        assert a.round() is not None  # renewed by its holder
    finally:
        w.close()


def _tables(world: World) -> dict[str, int]:
    return {
        t.name: world.count(t)
        for t in (instances, attempts, commands, events, workers, flow_versions)
    }


def test_dry_run_changes_nothing_and_counts_what_a_prune_deletes(world: World) -> None:
    world.populate()
    # events: two whose instances complete and go (plain), one whose instance is kept
    # forever (keep): that one stays
    record_events(world.engine, f"{world.plain}.tick", [("e1", {"n": 1}), ("e2", {"n": 2})])
    record_events(world.engine, f"{world.keep}.tick", [("e3", {"n": 3})])
    assert RuleEngine(world.engine, world.registry).handle_pending()[1] == 3
    world.run_until_idle()
    # an old version of plain no instance is on any more, and a silent worker
    with world.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO flow_versions (version, flow, path, source, loaded_at) "
                "VALUES ('0ld', :f, 'x', 'y', 1)"
            ),
            {"f": world.plain},
        )
        conn.execute(
            text(
                "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, running) "
                "VALUES ('gone', 'h', 1, 1, 1, 0)"
            )
        )
    default = parse_retention("completed=1s,failed=1s,killed=1s")
    rules = rules_for(world.registry.flows.values(), default, events=5.0)
    t = world.newest_change() + 100
    before = _tables(world)
    dry = prune(world.engine, rules, now=t, dry_run=True)
    assert _tables(world) == before
    real = prune(world.engine, rules, now=t, pacing=FAST)
    assert real == dry
    assert real["events"] == 2 and real["versions"] == 1 and real["workers"] == 1
    assert real["instances"] > 0 and real["attempts"] > 0
    assert prune(world.engine, rules, now=t, dry_run=True) == dict.fromkeys(real, 0)


def test_history_of_a_live_instance_is_cut_and_said(tmp_path, db_url) -> None:
    from runner.cli.explain import build
    from runner.ops.detail import get_instance
    from runner.ops.explanation import render_text

    mod = unique("poll_mod")
    name = unique("poller")
    src = "def poll(ctx):\n    return 'wait' if ctx.attempt >= 6 else None\n"
    body = (
        "initial: a\nstates:\n"
        f"  a: {{call: '{mod}:poll', to: [wait], try_interval: 10ms}}\n"
        "  wait: {external: true, on: {go: done}}\n  done: {terminal: true}\n"
    )
    write_flow(tmp_path / "flows", name, body, {mod: src})
    reg = FlowRegistry(tmp_path / "flows")
    assert reg.load_all() == []
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            iid = create_instance(conn, reg.get(name), {})
        cfg = WorkerConfig(worker_id=unique("w"), lease=10, exit_when_idle=True)
        asyncio.run(
            asyncio.wait_for(serve(engine, reg, cfg, install_signals=False, sensors=False), 120)
        )
        with engine.connect() as conn:
            nums = conn.execute(
                text(
                    "SELECT attempt, finished_at FROM attempts WHERE instance_id = :i"
                    " ORDER BY attempt"
                ),
                {"i": iid},
            ).all()
        assert [n for n, _ in nums] == [1, 2, 3, 4, 5, 6]
        rules = rules_for(reg.flows.values(), parse_retention("completed=1s"))
        got = prune(engine, rules, now=nums[-1][1] + 10, pacing=FAST)
        assert got["attempts"] == 5 and got["instances"] == 0
        item = get_instance(engine, iid)
        assert [a["attempt"] for a in item["history"]] == [6]
        assert item["history_pruned_before"] is not None
        text_out = render_text(build(engine, iid), nums[-1][1] + 10)
        assert "pruned (retention)" in text_out
    finally:
        engine.dispose()


def test_events_listing_marks_pruned_instances(world: World) -> None:
    from runner.ops.queries import list_events

    record_events(world.engine, f"{world.plain}.tick", [("only", {})])
    RuleEngine(world.engine, world.registry).handle_pending()
    world.run_until_idle()
    (ev,) = list_events(world.engine)
    assert ev["action"].startswith("started") and "(pruned)" not in ev["action"]
    rules = rules_for(world.registry.flows.values(), parse_retention("1s"))
    prune(world.engine, rules, now=world.newest_change() + 10, pacing=FAST)
    (ev,) = list_events(world.engine)  # the event stays 30 days; its instance went
    assert ev["action"].endswith("(pruned)")
    console = ConsoleData(world.engine, clock=time.time, flows_dir=None)
    (row,) = console.events()  # the console's events view: the same
    assert row["action"] == ev["action"]


def test_sqlite_file_shrinks_after_a_large_prune(tmp_path) -> None:
    from runner.store import space

    world = World(tmp_path, f"sqlite:///{tmp_path / 'big.db'}")
    try:
        pad = "x" * 2000
        with world.engine.begin() as conn:
            f = world.registry.get(world.plain)
            ids = [create_instance(conn, f, {"kind": "wait", "pad": pad}) for _ in range(5000)]
        assert all(r.ok for r in submit(world.engine, ids, "kill"))
        db = tmp_path / "big.db"

        def size() -> int:
            raw = world.engine.raw_connection()
            raw.driver_connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            raw.close()
            return db.stat().st_size

        full = size()
        assert space.auto_vacuum(world.engine) == space.INCREMENTAL
        rules = rules_for(world.registry.flows.values(), parse_retention("1s"))
        prune(world.engine, rules, now=world.newest_change() + 10, pacing=FAST)
        while space.vacuum_step(world.engine) > 2000:
            pass
        assert size() < full / 5
    finally:
        world.close()


def test_upgrade_from_the_current_release_keeps_every_row(tmp_path, db_url) -> None:
    engine = make_engine(db_url, create=False)
    try:
        migrate.upgrade(engine, "0004")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO instances (flow, version, state, status, data, fence, attempts,"
                    " errors, restarts, state_errors, state_restarts, state_changed, created_at,"
                    " updated_at, event_id) VALUES ('f', 'v', 'a', 'completed', '{}', 0, 1, 0,"
                    " 0, '[]', 0, 1, 1, 1, 7)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO attempts (instance_id, attempt, state, worker, fence, started_at)"
                    " VALUES (1, 1, 'a', 'w', 0, 1)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO events (sensor, key, payload, created_at)"
                    " VALUES ('f.s', 'k', '{}', 1)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO commands (instance_id, command, args, source, created_at, status)"
                    " VALUES (1, 'kill', '{}', 'cli', 1, 'applied')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO flow_versions (version, flow, path, source, loaded_at)"
                    " VALUES ('v', 'f', 'p', 's', 1)"
                )
            )
        tables = ("instances", "attempts", "events", "commands", "flow_versions")
        with engine.connect() as conn:
            before = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables
            }
        assert migrate.upgrade(engine) == migrate.head()
        with engine.connect() as conn:
            after = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables
            }
            row = conn.execute(text("SELECT event_id, history_from FROM instances")).one()
        assert after == before == dict.fromkeys(tables, 1)
        assert tuple(row) == (7, None)
    finally:
        engine.dispose()


def test_the_pacing_rests_longer_where_claims_share_only_the_machine(db_url) -> None:
    """The default pacing per database (``docs/performance.md``, "Prune batches compiled
    once"): SQLite, whose claims wait for the pruner's write lock, short batches and a
    rest of 3x; PostgreSQL, where only the machine is shared, longer batches and 9x.
    What a caller sets is kept."""
    engine = make_engine(db_url)
    try:
        pacing = ops_prune.resolved(None, engine)
        sqlite = db_url.startswith("sqlite")
        assert (pacing.batch, pacing.rest) == ((100, 3.0) if sqlite else (500, 9.0))
        assert ops_prune.resolved(Pacing(batch=7, rest=0.5), engine).rest == 0.5
    finally:
        engine.dispose()


def test_text_names_every_kind() -> None:
    line = ops_prune.text({"instances": 3}, dry_run=True)
    assert line.startswith("would prune 3 instances, 0 attempts")


@pytest.mark.postgres
def test_pruner_survives_a_database_outage(tmp_path, pg_url, caplog) -> None:
    from runner.service.pruner import Pruner
    from runner.service.supervisor import Supervisor
    from tests.support.tcp_proxy import TcpProxy

    w = World(tmp_path, pg_url)
    proxy, via_proxy = TcpProxy.to_url(pg_url)
    engine = make_engine(via_proxy)
    try:
        groups = w.populate()
        killed = groups[w.plain]["killed"]
        sup = Supervisor()
        pruner = Pruner(
            engine,
            w.registry,
            "wp",
            5.0,
            default=parse_retention("completed=forever,failed=forever,killed=1s"),
            every=0.2,
            first_after=0.2,
            pacing=FAST,
        )

        async def scenario() -> None:
            stop = asyncio.Event()
            proxy.cut()  # the database is away when the pruner starts, for a while
            task = asyncio.ensure_future(sup.keep("pruner", lambda: pruner.run(stop), stop))
            await asyncio.sleep(3.0)
            assert not task.done()
            assert all(i in w.statuses() for i in killed)  # nothing pruned meanwhile
            proxy.restore()
            for _ in range(300):
                if not any(i in w.statuses() for i in killed):
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.wait_for(task, 30)

        asyncio.run(scenario())
        assert not any(i in w.statuses() for i in killed)  # pruned once it was back
        part = sup.parts["pruner"]
        assert part.expected_failures >= 1 and sup.healthy()
        assert "Traceback" not in caplog.text
    finally:
        engine.dispose()
        proxy.close()
        w.close()


def _vacuums(engine, table: str) -> int:
    """``VACUUM`` runs on ``table`` so far, by hand or by the pruner (not autovacuum)."""
    with engine.connect() as conn:
        got = conn.execute(
            text("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = :t"), {"t": table}
        ).scalar_one()
    return int(got)


@pytest.mark.postgres
def test_tables_autovacuum_leaves_alone_are_vacuumed_by_the_pruner(
    tmp_path, pg_url, caplog
) -> None:
    """Where autovacuum does not run (turned off here for two tables; a server may have it
    off altogether, as CI's does), each pruner round ends with a ``VACUUM (ANALYZE)`` of
    those tables, and the first says so in one WARNING; ``flowrun prune --vacuum``
    vacuums every table."""
    import logging

    from runner.service.pruner import Pruner
    from runner.store import space
    from tests.support.fault import flowrun_cmd

    w = World(tmp_path, pg_url)
    try:
        w.populate()  # rows written, updated and deleted: dead row versions
        with w.engine.connect() as conn:
            server_on = conn.execute(text("SHOW autovacuum")).scalar_one() == "on"
        with w.engine.begin() as conn:
            for table in ("instances", "events"):
                conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        off = space.unvacuumed(w.engine)
        if server_on:
            assert off == ["events", "instances"]
        else:  # every flowrun table, the two above among them
            assert {"attempts", "events", "instances", "workers"} <= set(off)
        before = {t: _vacuums(w.engine, t) for t in space.TABLES}
        pruner = Pruner(w.engine, w.registry, "wv", 30.0, pacing=FAST)
        caplog.set_level(logging.INFO, logger="flowrun.pruner")
        assert pruner.round() is not None
        assert pruner.round() is not None

        def vacuumed_twice() -> bool:
            return all(_vacuums(w.engine, t) >= before[t] + 2 for t in off)

        deadline = time.monotonic() + 30  # the server's statistics may trail the VACUUM
        while not vacuumed_twice() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert vacuumed_twice(), {t: (before[t], _vacuums(w.engine, t)) for t in off}
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.name == "flowrun.pruner" and r.levelno == logging.WARNING
        ]
        assert len(warnings) == 1 and "autovacuum is off for" in warnings[0], warnings
        assert ", ".join(off) in warnings[0]
        seen = {t: _vacuums(w.engine, t) for t in space.TABLES}
        # a table autovacuum looks after is left to it
        assert all(seen[t] == before[t] for t in space.TABLES if t not in off), (before, seen)
        res = subprocess.run(
            [*flowrun_cmd(), "--flows", str(tmp_path / "flows"), "--db", pg_url]
            + ["prune", "--vacuum", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["vacuumed"] is True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            _vacuums(w.engine, t) > seen[t] for t in space.TABLES
        ):
            time.sleep(0.1)
        assert all(_vacuums(w.engine, t) > seen[t] for t in space.TABLES)
    finally:
        w.close()
