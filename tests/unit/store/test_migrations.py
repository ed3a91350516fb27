"""The alembic migrations (``runner/store/migrations``, run by ``runner.store.migrate.upgrade``).

On SQLite and PostgreSQL alike: the migrations produce exactly the schema of
``runner/models.py`` (alembic's ``compare_metadata`` finds no difference); running them
again does nothing; a database made by ``metadata.create_all`` before migrations existed
(today's schema, or the older one of commit 083da5a) is stamped and upgraded with its rows
intact; several processes upgrading one new database at once all succeed; a database
stamped by a newer flowrun is refused with one clear line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Index, MetaData, func, insert, inspect, select, text

from runner.errors import ConfigError
from runner.store import migrate
from runner.store.db import make_engine
from runner.store.revision import latest_revision
from runner.store.tables import attempts, instances, metadata

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """An empty database: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'flowrun.db'}"
    return request.getfixturevalue("pg_url")


def schema_diffs(engine) -> list:
    """Differences between the database's schema and ``runner.store.tables`` (empty: identical)."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(ctx, metadata)


def revision(engine) -> str | None:
    """The revision stamped in ``engine``'s database."""
    with engine.connect() as conn:
        return migrate.current(conn)


def legacy_083da5a_metadata() -> MetaData:
    """The schema as ``create_all`` made it up to commit 083da5a (before migrations).

    Today's tables, except that attempts had a plain ``(instance_id, id)`` index instead of
    the ``(instance_id, attempt)`` unique constraint (added by revision 0002), instances
    had no ``label`` (added by revision 0003) and workers no ``heartbeat_every`` (0004),
    ``boot_id`` or ``pid_started`` (0005), instances no ``history_from`` (0006), no
    ``pools`` table nor pool columns (0007), no ``attempt_logs`` table (0008), no
    ``deliveries`` table (0009), ``ix_instances_flow_status`` on ``(flow, status)`` only
    (0010), no ``priority`` nor ``start_priority`` and ``ix_instances_claim`` on
    ``(status, due_at)`` (0011), no ``limit_key`` nor ``ix_instances_limit`` (0012), no
    ``deadline_at`` nor ``ix_instances_deadline`` (0013), no ``runs_on``, ``route_event`` nor
    ``ix_instances_runs_on``, workers no ``labels`` (0014), attempts no ``log_bytes``
    (0015).
    """
    md = MetaData()
    for table in metadata.sorted_tables:
        if table.name not in ("attempt_logs", "deliveries"):  # 0008, 0009
            table.to_metadata(md)
    inst = md.tables["instances"]
    inst._columns.remove(inst.c.label)  # no public API drops a column from a Table
    inst._columns.remove(inst.c.history_from)  # 0006, with ix_instances_event
    for column in ("runs_on", "route_event", "deadline_at"):  # 0014, 0013
        inst._columns.remove(inst.c[column])
    for column in ("pool", "pool_slots", "waiting_for", "wait_due", "limit_key"):  # 0007, 0012
        inst._columns.remove(inst.c[column])
    for column in ("priority", "start_priority"):  # 0011
        inst._columns.remove(inst.c[column])
    md.remove(md.tables["pools"])
    gone = (
        "ix_instances_event",
        "ix_instances_flow_status",
        "ix_instances_pool",
        "ix_instances_claim",
        "ix_instances_waiting",  # 0007
        "ix_instances_limit",  # 0012
        "ix_instances_deadline",  # 0013
        "ix_instances_runs_on",  # 0014
    )
    inst.indexes = {i for i in inst.indexes if i.name not in gone}
    Index("ix_instances_flow_status", inst.c.flow, inst.c.status)  # (flow, status, id): 0010
    Index("ix_instances_claim", inst.c.status, inst.c.due_at)  # priority in it: 0011
    for column in ("heartbeat_every", "boot_id", "pid_started", "labels"):  # labels: 0014
        md.tables["workers"]._columns.remove(md.tables["workers"].c[column])
    att = md.tables["attempts"]
    att._columns.remove(att.c.log_bytes)  # 0015
    for constraint in list(att.constraints):
        if constraint.name == "uq_attempts_instance_attempt":
            att.constraints.discard(constraint)
    Index("ix_attempts_instance", att.c.instance_id, att.c.id)
    return md


def _instance_row(**over) -> dict:
    row = {
        "flow": "f",
        "version": "v1",
        "state": "a",
        "status": "runnable",
        "data": {"k": 1},
        "due_at": 1.0,
        "fence": 0,
        "attempts": 1,
        "errors": 0,
        "restarts": 0,
        "state_errors": [],
        "state_restarts": 0,
        "state_changed": 1.0,
        "created_at": 1.0,
        "updated_at": 1.0,
    }
    row.update(over)
    return row


def test_migrations_produce_the_models_schema(db_url):
    engine = make_engine(db_url)
    try:
        assert revision(engine) == migrate.head()
        assert schema_diffs(engine) == []
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        engine.dispose()


def test_jsonb_on_postgresql_json_on_sqlite(db_url):
    engine = make_engine(db_url)
    try:
        cols = {c["name"]: c["type"] for c in inspect(engine).get_columns("instances")}
        kind = type(cols["data"]).__name__
        assert kind == ("JSONB" if engine.dialect.name == "postgresql" else "JSON")
    finally:
        engine.dispose()


def test_upgrade_again_does_nothing(db_url):
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(instances), [_instance_row()])
        assert migrate.upgrade(engine) == migrate.head()
        engine2 = make_engine(db_url)
        engine2.dispose()
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(instances)).scalar() == 1
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("legacy", ["today", "083da5a"])
def test_database_made_before_migrations_is_stamped_and_upgraded(db_url, legacy):
    old = make_engine(db_url, create=False)
    md = metadata if legacy == "today" else legacy_083da5a_metadata()
    with old.begin() as conn:
        md.create_all(conn)
        old_instances = md.tables["instances"]  # without the columns added since
        iid = conn.execute(
            insert(old_instances).returning(old_instances.c.id), _instance_row()
        ).scalar()
        conn.execute(
            insert(attempts),
            [
                {
                    "instance_id": iid,
                    "attempt": 1,
                    "state": "a",
                    "worker": "w1",
                    "fence": 1,
                    "started_at": 1.0,
                    "outcome": "moved",
                    "checkpoint": {"x": [1, 2]},
                }
            ],
        )
    with old.connect() as conn:
        assert migrate.legacy_revision(conn) == (migrate.head() if legacy == "today" else "0001")
    old.dispose()

    engine = make_engine(db_url)
    try:
        assert revision(engine) == migrate.head()
        assert schema_diffs(engine) == []
        with engine.connect() as conn:
            row = conn.execute(select(instances)).mappings().one()
            assert row["data"] == {"k": 1}
            att = conn.execute(select(attempts)).mappings().one()
            assert (att["instance_id"], att["attempt"]) == (iid, 1)
            assert att["checkpoint"] == {"x": [1, 2]}
    finally:
        engine.dispose()


def test_downgrade_and_upgrade_round_trip(db_url):
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            from alembic import command

            command.downgrade(migrate.alembic_config(conn), "0001")
        assert revision(engine) == "0001"
        assert migrate.upgrade(engine) == migrate.head()
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()


def test_schema_from_a_newer_flowrun_is_refused(db_url):
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(ConfigError) as info:
        make_engine(db_url)
    message = str(info.value)
    assert "'9999'" in message and "upgrade flowrun" in message
    assert "\n" not in message


def test_unknown_tables_are_refused_not_stamped(tmp_path):
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    engine = make_engine(url, create=False)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE instances (id INTEGER PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE attempts (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(ConfigError, match="unknown schema"):
        make_engine(url)


UPGRADER = """
import sys, time
from runner.store.db import make_engine
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
make_engine(sys.argv[1]).dispose()
print("ok")
"""


@pytest.mark.parametrize("legacy", [False, True], ids=["empty", "legacy"])
def test_concurrent_upgrades_all_succeed(db_url, legacy):
    if legacy:
        old = make_engine(db_url, create=False)
        with old.begin() as conn:
            legacy_083da5a_metadata().create_all(conn)
        old.dispose()
    start = time.time() + 1.5  # every process imports first, then all race at once
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADER, db_url, str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "ok"
    engine = make_engine(db_url, create=False)
    try:
        assert revision(engine) == migrate.head()
        assert schema_diffs(engine) == []
    finally:
        engine.dispose()


def test_latest_revision_read_without_alembic_is_alembics_head():
    assert latest_revision() == migrate.head()


UP_TO_DATE = """
import sys
from runner.store.db import make_engine
make_engine(sys.argv[1]).dispose()
print(sorted(m for m in sys.modules if m.split(".")[0] == "alembic"))
"""


def test_a_database_at_head_is_opened_without_importing_alembic(db_url):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def open_in_subprocess() -> str:
        proc = subprocess.run(
            [sys.executable, "-c", UP_TO_DATE, db_url],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert open_in_subprocess() != "[]"  # an empty database: alembic creates the tables
    assert open_in_subprocess() == "[]"  # already at head: one read, no alembic
    engine = make_engine(db_url, create=False)
    try:
        with engine.begin() as conn:
            from alembic import command

            command.downgrade(migrate.alembic_config(conn), "0001")
        assert open_in_subprocess() != "[]"  # behind: upgraded (0001 -> head)
        assert revision(engine) == migrate.head()
    finally:
        engine.dispose()
