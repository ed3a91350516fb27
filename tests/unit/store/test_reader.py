"""The read side's two drivers read the same: stdlib ``sqlite3`` (``SqliteReader``, the
CLI on a SQLite file) and SQLAlchemy (``EngineReader``, PostgreSQL and the console) run
one set of SQL texts and give equal values, of equal types, on the same file; the CLI
prints the same bytes either way; a database not at this flowrun's revision is never read
by ``sqlite3`` but left to ``make_engine``, which upgrades or refuses it as before."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from sqlalchemy import text, update

from runner.ops.detail import get_instance, instance_rows, read_instance
from runner.ops.liveness import list_workers, read_workers
from runner.ops.queries import count_by_status, list_events, list_instances, read_instances
from runner.ops.views import TABLE_KEYS
from runner.store import reader as rd
from runner.store import tables
from runner.store.db import make_engine
from runner.store.pg_reader import PgReader, open_postgres, pyformat
from runner.store.reader import EngineReader, SqliteReader, open_sqlite, sqlite_file
from runner.store.revision import latest_revision
from tests.support.cli import flowrun
from tests.support.console_db import NOW, build_db


def _start_one(engine) -> None:
    """Instance 1 started by an event and running an attempt."""
    with engine.begin() as conn:
        conn.execute(
            update(tables.instances)
            .where(tables.instances.c.id == 1)
            .values(event_id=1, running_attempt=4, state_attempted=NOW - 1)
        )
        # a heartbeat in the future: an age of 0 at any clock, so the CLI prints the same
        conn.execute(update(tables.workers).values(heartbeat_at=NOW * 3))


@pytest.fixture()
def db(tmp_path: Path):
    """The console's fixed database, with instance 1 started by an event and running an
    attempt (so every JSON column and the running-attempt row are read)."""
    engine, path, flows = build_db(tmp_path)
    _start_one(engine)
    yield engine, path, flows
    engine.dispose()


def typed(value) -> str:
    """``value`` spelled with the type of every leaf (1 and 1.0 and True differ)."""
    return json.dumps(value, default=lambda v: repr(v), sort_keys=False) + repr(value)


#: Every read query, as the CLI and the console run them (both readers run each).
QUERIES = [
    lambda r: read_instances(r),
    lambda r: read_instances(r, keys=TABLE_KEYS, limit=3, desc=True),
    lambda r: read_instances(r, text="ORDER 1", order_by="attempts", desc=True),
    lambda r: read_instances(r, text='"order": 4'),
    lambda r: read_instances(r, flow="reports", status="sleeping", offset=0, limit=9),
    lambda r: list_instances(r, order_by="due_at"),
    lambda r: count_by_status(r),
    lambda r: count_by_status(r, "orders"),
    lambda r: read_instance(r, 1),
    lambda r: read_instance(r, 5, history=4, commands_limit=1),
    lambda r: read_instance(r, 404),
    lambda r: get_instance(r, 1)["history"],
    lambda r: {k: v for k, v in get_instance(r, 4).items() if k != "budget"},
    lambda r: get_instance(r, 3)["commands"],
    lambda r: instance_rows(r, 1),
    lambda r: read_workers(r, now=NOW),
    lambda r: list_workers(r, now=NOW + 60),
    lambda r: list_events(r),
    lambda r: list_events(r, limit=1),
]


def test_the_column_lists_are_the_tables():
    assert rd.INSTANCE_COLUMNS == tuple(tables.instances.c.keys())
    assert rd.ATTEMPT_COLUMNS == tuple(tables.attempts.c.keys())
    assert rd.COMMAND_COLUMNS == tuple(tables.commands.c.keys())
    assert rd.EVENT_COLUMNS == tuple(tables.events.c.keys())
    assert rd.WORKER_COLUMNS == tuple(tables.workers.c.keys())
    json_columns = {
        c.name for t in tables.metadata.sorted_tables for c in t.c if "JSON" in repr(c.type)
    }
    assert rd.JSON_COLUMNS == json_columns


def test_every_query_reads_the_same_through_sqlite3_and_sqlalchemy(db):
    engine, path, _ = db
    fast = open_sqlite(f"sqlite:///{path}", latest_revision())
    assert isinstance(fast, SqliteReader)
    slow = EngineReader(engine)
    try:
        queries = QUERIES
        for i, query in enumerate(queries):
            assert typed(query(fast)) == typed(query(slow)), i
        # the data of each path is real, not two empty answers
        assert instance_rows(fast, 1)["event"]["payload"] == {"path": "inbox/a.csv"}
        assert read_instance(fast, 1).attempts[0]["outcome"] is None  # running now
        assert read_instance(fast, 1).attempts[2]["checkpoint"] == {"page": 3}
        assert read_instances(fast, keys=("id", "state_errors"))[3]["state_errors"][0] > 0
        assert get_instance(fast, 1)["budget"] == get_instance(slow, 1)["budget"] is not None
        assert sum(count_by_status(fast).values()) == 12
        events = list_events(fast)
        assert [(e["key"], e["payload"], e["handled_at"]) for e in events] == [
            ("inbox/b.csv", {"path": "inbox/b.csv"}, None),
            ("inbox/a.csv", {"path": "inbox/a.csv"}, events[1]["handled_at"]),
        ]
        assert events[1]["handled_at"].endswith("Z") and events[1]["action"]
    finally:
        fast.close()


def test_cli_output_is_byte_identical_on_both_paths(db, tmp_path: Path):
    _, path, flows = db
    env = {**os.environ, "FLOWRUN_FLOWS": str(flows), "TEST_CWD": str(tmp_path)}
    # a URL with a query string is left to SQLAlchemy (runner.store.reader.sqlite_file)
    urls = (f"sqlite:///{path}", f"sqlite:///{path}?timeout=30")
    assert sqlite_file(urls[0]) == str(path) and sqlite_file(urls[1]) is None
    for args in (
        ["ls"],
        ["ls", "--json"],
        ["ls", "--limit", "3", "--json"],
        ["ls", "--search", "refused"],
        ["show", "1"],
        ["show", "1", "--json"],
        ["show", "4", "--json"],
        ["workers"],
        ["workers", "--json"],
        ["explain", "4", "--json"],
        ["events"],
        ["events", "--json"],
        ["events", "--limit", "1", "--json"],
    ):
        fast, slow = (flowrun(env, "--db", url, *args).stdout for url in urls)
        assert fast == slow, args
        assert fast.strip(), args
    for url in urls:
        out = flowrun(env, "--db", url, "show", "404", code=1)
        assert out.stderr == "flowrun: no instance 404\n"


def test_only_a_current_sqlite_file_is_read_by_sqlite3(tmp_path: Path):
    head = latest_revision()
    current = tmp_path / "current.db"
    make_engine(f"sqlite:///{current}").dispose()
    opened = open_sqlite(f"sqlite:///{current}", head)
    assert opened is not None
    opened.close()
    assert open_sqlite(f"sqlite:///{current}", "0001") is None  # another revision
    assert open_sqlite(f"sqlite:///{tmp_path / 'missing.db'}", head) is None
    assert not (tmp_path / "missing.db").exists()  # nothing created
    (tmp_path / "empty.db").write_bytes(b"")
    assert open_sqlite(f"sqlite:///{tmp_path / 'empty.db'}", head) is None
    (tmp_path / "text.db").write_text("not a database\n" * 100)
    assert open_sqlite(f"sqlite:///{tmp_path / 'text.db'}", head) is None
    unstamped = tmp_path / "unstamped.db"
    shutil.copy(current, unstamped)
    engine = make_engine(f"sqlite:///{unstamped}", create=False)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
    engine.dispose()
    assert open_sqlite(f"sqlite:///{unstamped}", head) is None
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql://u@h/db", "sqlite:///~/x.db"):
        assert open_sqlite(url, head) is None


def test_the_sqlite3_reader_cannot_write(tmp_path: Path):
    path = tmp_path / "ro.db"
    make_engine(f"sqlite:///{path}").dispose()
    reader = open_sqlite(f"sqlite:///{path}", latest_revision())
    assert reader is not None
    try:
        with pytest.raises(Exception, match="readonly|read-only|query_only"):
            reader.conn.execute("DELETE FROM instances")
    finally:
        reader.close()


def test_an_old_database_is_upgraded_and_a_newer_one_refused_as_before(tmp_path: Path):
    env = {**os.environ, "TEST_CWD": str(tmp_path)}
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    with engine.begin() as conn:
        from alembic import command

        from runner.store.migrate import alembic_config

        command.downgrade(alembic_config(conn), "0001")
    assert flowrun(env, "--db", url, "ls").stdout.endswith("0 instances\n")  # upgraded
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == (
            latest_revision()
        )
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    for args in (["ls"], ["ls", "--json"], ["show", "1"], ["workers", "--json"]):
        out = flowrun(env, "--db", url, *args, code=2)
        assert "'9999', unknown to this flowrun" in out.stderr, args
        assert out.stderr.count("\n") == 1 and out.stdout == ""


@pytest.fixture()
def pg_db(tmp_path: Path, pg_url: str):
    """The same fixed database on PostgreSQL."""
    engine, _path, flows = build_db(tmp_path, pg_url)
    _start_one(engine)
    yield engine, pg_url, flows
    engine.dispose()


def test_every_query_reads_the_same_through_psycopg_and_sqlalchemy(pg_db):
    """PostgreSQL: the CLI's psycopg-only reader (``runner.store.pg_reader``) and
    SQLAlchemy give equal values of equal types for every query."""
    engine, url, _ = pg_db
    fast = open_postgres(url, latest_revision(), "test")
    assert isinstance(fast, PgReader)
    slow = EngineReader(engine)
    try:
        for i, query in enumerate(QUERIES):
            assert typed(query(fast)) == typed(query(slow)), i
        assert instance_rows(fast, 1)["event"]["payload"] == {"path": "inbox/a.csv"}
        assert read_instance(fast, 1).attempts[2]["checkpoint"] == {"page": 3}
        assert sum(count_by_status(fast).values()) == 12
        assert list_events(fast)[1]["handled_at"].endswith("Z")
        with pytest.raises(Exception, match="read-only"), fast.snapshot() as run:
            run("DELETE FROM instances WHERE id = :id", {"id": 1})
        assert sum(count_by_status(fast).values()) == 12  # and it still reads
    finally:
        fast.close()


def test_cli_output_is_byte_identical_through_psycopg_and_sqlalchemy(pg_db, tmp_path: Path):
    _, url, flows = pg_db
    env = {**os.environ, "FLOWRUN_FLOWS": str(flows), "TEST_CWD": str(tmp_path)}
    # a URL with a query string is left to SQLAlchemy (runner.store.pg_reader)
    urls = (url, url + "?connect_timeout=9")
    for args in (
        ["ls"],
        ["ls", "--json"],
        ["ls", "--search", "refused"],
        ["show", "1"],
        ["show", "4", "--json"],
        ["workers", "--json"],
        ["explain", "4", "--json"],
        ["events", "--json"],
        ["pool", "ls", "--json"],
    ):
        fast, slow = (flowrun(env, "--db", u, *args).stdout for u in urls)
        assert fast == slow, args
        assert fast.strip(), args
    for u in urls:
        out = flowrun(env, "--db", u, "show", "404", code=1)
        assert out.stderr == "flowrun: no instance 404\n"


def test_only_a_current_postgresql_database_is_read_by_psycopg_alone(pg_url: str):
    head = latest_revision()
    assert open_postgres(pg_url, head, "t") is None  # no schema yet: make_engine's
    make_engine(pg_url).dispose()
    opened = open_postgres(pg_url, head, "t")
    assert opened is not None
    opened.close()
    assert open_postgres(pg_url, "0001", "t") is None  # another revision
    assert open_postgres(pg_url + "?sslmode=disable", head, "t") is None  # parameters
    assert open_postgres("postgresql://postgres@127.0.0.1:1/test", head, "t") is None
    assert open_postgres(f"sqlite:///{pg_url}", head, "t") is None


def test_pyformat_keeps_casts_and_percent_signs():
    sql = "SELECT a::jsonb, 'x%' FROM t WHERE b = :b AND c LIKE :like AND d = :d_2"
    assert pyformat(sql) == (
        "SELECT a::jsonb, 'x%%' FROM t WHERE b = %(b)s AND c LIKE %(like)s AND d = %(d_2)s"
    )


def test_a_read_failing_on_postgresql_is_one_line(pg_db, tmp_path: Path):
    """A statement of the psycopg reader that fails (here: a table gone from a database
    still stamped with this revision) is one line and exit 75, like any driver's."""
    engine, url, flows = pg_db
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE events CASCADE"))
    env = {**os.environ, "FLOWRUN_FLOWS": str(flows), "TEST_CWD": str(tmp_path)}
    out = flowrun(env, "--db", url, "events", code=75)
    assert out.stderr.startswith("flowrun: database error: ") and out.stderr.count("\n") == 1
    assert 'relation "events" does not exist' in out.stderr
