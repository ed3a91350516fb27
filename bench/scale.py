"""Big tables, same speed: flowrun with a large history in its database (not a test).

Builds a database through flowrun's own code: ``--size`` sensor events stored by
``record_events``, each starting an instance through the rule engine, every instance
driven by a real ``flowrun --daemon --exit-when-idle`` through a flow of five no-op
``call`` states (five attempts each) to ``completed``. So ``--size 1000000`` is the
issue's 1,000,000 terminal instances, 5,000,000 attempts and 1,000,000 events.

Then measures, on that database against the same on an empty one:

On PostgreSQL with the server's ``autovacuum`` off, the big database is ``VACUUM ANALYZE``d
after its build (``"autovacuum"`` in the report says which).

- **no-op throughput**: ``--new`` new instances of a three-state no-op flow drained by
  one daemon (transitions/s, as ``bench/throughput.py``);
- **read side**: ``flowrun ls --limit 50``, ``show ID``, ``explain ID``, ``events
  --limit 50`` (wall ms of the whole command, best of 3);
- **prune under load**: ``flowrun prune --flow hist --older-than 1s`` deleting the history
  while a daemon drains ``--new`` new instances: the daemon's transitions/s against its
  rate on the empty database, the prune's wall time and rows, and the file size before
  and after; then the events those instances left (``--event-retention 1s``), alone.

- **RSS** (``--parked N``): a daemon's RSS with N instances waiting in an external
  state and N sleeping, against the same daemon with none.

    python bench/scale.py [--size 20000] [--new 20000] [--db sqlite|postgresql]
                          [--pg-url URL] [--concurrency 64] [--keep DIR] [--parked N]

Prints one JSON object, each figure with the ``loadavg`` (1, 5, 15 min) at its end. The
console's paint and scroll times are ``bench/console.py``'s (point it at the database kept
with ``--keep``).

**Build once, measure later.** A build of ``--size 1000000`` bulk-loads the rows flowrun
itself writes (34 s on a shared 2-core machine, a 714 MB SQLite file; checked against a
build through flowrun's own code at ``--size 300``: the same schema and rows but the
times), so it can be made once and measured again and again, e.g.
on a quiet machine:

    python bench/scale.py --size 1000000 --build-only --keep DIR [--db postgresql]
    python bench/scale.py --from DIR [--new 20000] [--keep OTHER] [--parked N]

``--build-only`` builds only the big database, into ``DIR/big`` (SQLite: ``flowrun.db``
there; PostgreSQL: a database named in ``DIR/big/build.json``, which also holds the build's
figures) and stops. ``--from DIR`` takes ``--size`` and ``--db`` from that file, copies the
big database (SQLite: the folder, into ``--keep OTHER`` or a temporary folder; PostgreSQL:
``CREATE DATABASE ... TEMPLATE`` the built one, dropped at the end unless ``--keep``) and
runs every measurement above on the copy, the build's figures copied into the report:
the build in ``DIR`` stays as built (a prune measured once cannot be measured again on
the same rows). Progress of a build goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

HISTORY = """\
flow: hist
initial: s1
states:
  s1: {call: "scale_tasks:noop", next: s2}
  s2: {call: "scale_tasks:noop", next: s3}
  s3: {call: "scale_tasks:noop", next: s4}
  s4: {call: "scale_tasks:noop", next: s5}
  s5: {call: "scale_tasks:noop", next: done}
  done: {terminal: true}
sensors:
  feed: {every: 1000d}
rules:
  - when: feed
    start: hist
    data: {from: feed}
"""

NOOP = """\
flow: noop
initial: s1
states:
  s1: {call: "scale_tasks:noop", next: s2}
  s2: {call: "scale_tasks:noop", next: done}
  done: {terminal: true}
"""

TASKS = """\
import time


async def noop(ctx):
    return True


def nap(ctx):
    return ctx.sleep_until(time.time() + 7 * 86400)
"""

PARKED = """\
flow: parked
initial: wait
states:
  wait: {external: true, on: {go: done}}
  done: {terminal: true}
"""

SLEEPER = """\
flow: sleeper
initial: s1
states:
  s1: {call: "scale_tasks:nap", next: done}
  done: {terminal: true}
"""


def rss_idle(url: str, flows: Path, parked: int) -> dict:
    """A daemon's RSS (KiB, 15 s after start) with ``parked`` instances waiting in an
    external state and as many sleeping for a week (each put to sleep by its handler),
    against the same daemon on the same database before them."""
    import signal

    from sqlalchemy import text

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine

    def sample() -> int:
        env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
        argv = [sys.executable, "-m", "runner.cli", "--daemon", "--prune-every", "0"]
        proc = subprocess.Popen(argv, env=env, cwd=flows.parent, stderr=subprocess.DEVNULL)
        time.sleep(15)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kib = int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS:")).split()[1])
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        return kib

    (flows / "parked.yaml").write_text(PARKED)
    (flows / "sleeper.yaml").write_text(SLEEPER)
    none = sample()
    engine = make_engine(url)
    with engine.begin() as conn:
        for name in ("parked", "sleeper"):
            flow = load_flow(flows / f"{name}.yaml")
            create_instances(conn, flow, [{"i": i} for i in range(parked)])
    engine.dispose()
    # each sleeper's handler runs once and sleeps (a week: the daemon is never idle)
    engine = make_engine(url)
    proc = _daemon(url, flows, 64)
    while True:
        time.sleep(2)
        with engine.connect() as conn:
            left = conn.execute(
                text(
                    "SELECT count(*) FROM instances WHERE flow = 'sleeper' AND status != 'sleeping'"
                )
            ).scalar_one()
        if not left:
            break
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    engine.dispose()
    return {
        "parked": parked,
        "rss_kib_none": none,
        "rss_kib_parked": sample(),
    }


def _daemon(url: str, flows: Path, concurrency: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    argv = [sys.executable, "-m", "runner.cli", "--daemon", "--exit-when-idle"]
    argv += ["--concurrency", str(concurrency), "--prune-every", "0", *extra]
    return subprocess.Popen(argv, env=env, cwd=flows.parent, stderr=subprocess.DEVNULL)


#: The pace of a build through flowrun's own code (``record_events``, the rule engine, a
#: daemon at ``--concurrency 64``), seconds per instance, measured at 1,000,000 on the shared
#: 2-core machine: 41 min to store the events and start the instances, 18 min to drain them.
#: The bulk build spreads its timestamps at that pace, ending at the build's time.
MADE_S, DRAINED_S = 41 * 60 / 1e6, 18 * 60 / 1e6


def build(url: str, flows: Path, size: int, concurrency: int) -> dict:
    """``size`` completed ``hist`` instances, their events and 5 attempts each, bulk-inserted
    as the rows flowrun writes for them (``record_events``, the rule engine, then a daemon
    claiming ``concurrency`` at a time: attempt ids in waves of ``concurrency`` a state);
    timestamps end now, spread at that build's pace (:data:`MADE_S`, :data:`DRAINED_S`).
    The schema is flowrun's own (``make_engine``; flow versions by ``load_registry``). A
    real daemon then runs on it until idle (its worker row, the sensor's cursor). Returns
    the timings (s)."""
    import socket

    from sqlalchemy import text

    from runner.service.startup import load_registry
    from runner.store.db import make_engine

    engine = make_engine(url)
    load_registry(engine, flows)
    with engine.connect() as conn:
        version = conn.execute(
            text("SELECT version FROM flow_versions WHERE flow = 'hist'")
        ).scalar_one()
    engine.dispose()
    t0 = time.perf_counter()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    drained = time.time() - size * DRAINED_S
    made = drained - size * MADE_S
    step = DRAINED_S * concurrency / 5  # one state of one wave, s

    def events():
        for i in range(1, size + 1):
            t = made + i * MADE_S
            yield (
                i,
                "hist.feed",
                f"e{i - 1}",
                f'{{"n": "{i - 1}"}}',
                t,
                t + 0.02,
                f"started hist instance {i}",
            )

    def waves():
        """(first instance, end, wave's start) of each wave of the drain."""
        for lo in range(1, size + 1, concurrency):
            yield lo, min(size + 1, lo + concurrency), drained + (lo - 1) * DRAINED_S

    def instances():
        for lo, hi, t in waves():
            done = t + 4.8 * step
            for i in range(lo, hi):
                yield (
                    i,
                    "hist",
                    version,
                    "done",
                    "completed",
                    '{"from": "feed"}',
                    1,
                    5,
                    0,
                    0,
                    "[]",
                    0,
                    done,
                    done,
                    made + i * MADE_S + 0.02,
                    done,
                    i,
                    5,
                )

    def attempts():
        n = 1
        for lo, hi, t in waves():
            for k in range(5):
                to = f"s{k + 2}" if k < 4 else "done"
                start, end = t + k * step, t + (k + 0.8) * step
                for i in range(lo, hi):
                    yield (n, i, k + 1, f"s{k + 1}", worker, 1, start, end, "moved", to, 0)
                    n += 1

    bulk(url, [(EVENTS, events()), (INSTANCES, instances()), (ATTEMPTS, attempts())])
    inserted = time.perf_counter() - t0
    t1 = time.perf_counter()
    _daemon(url, flows, concurrency).wait()
    return {
        "bulk_insert_s": round(inserted, 1),
        "daemon_until_idle_s": round(time.perf_counter() - t1, 1),
    }


#: The columns :func:`build` fills (the others stay NULL, as flowrun leaves them).
EVENTS = "events (id, sensor, key, payload, created_at, handled_at, action)"
INSTANCES = (
    "instances (id, flow, version, state, status, data, fence, attempts, errors, restarts,"
    " state_errors, state_restarts, state_changed, state_attempted, created_at, updated_at,"
    " event_id, priority)"
)
ATTEMPTS = (
    "attempts (id, instance_id, attempt, state, worker, fence, started_at, finished_at,"
    " outcome, to_state, log_bytes)"
)


def bulk(url: str, tables: list) -> None:
    """Insert each ``(table (columns), rows)`` of ``tables``: SQLite ``executemany``,
    100,000 rows a transaction, ``synchronous=OFF``, the tables' secondary indexes dropped
    for the load and made again after with their own SQL; PostgreSQL ``COPY``, then the
    id sequences moved past the rows."""
    import itertools

    names = [target.split()[0] for target, _ in tables]
    if url.startswith("sqlite"):
        import sqlite3

        db = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        db.execute("PRAGMA synchronous=OFF")
        listed = ", ".join(f"'{t}'" for t in names)
        indexes = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            f" AND tbl_name IN ({listed})"
        ).fetchall()
        for name, _ in indexes:
            db.execute(f"DROP INDEX {name}")
        for target, rows in tables:
            width = target.count(",") + 1
            sql = f"INSERT INTO {target} VALUES ({', '.join('?' * width)})"
            while chunk := list(itertools.islice(rows, 100_000)):
                db.execute("BEGIN")
                db.executemany(sql, chunk)
                db.execute("COMMIT")
        for _, sql in indexes:
            db.execute(sql)
        db.close()
        return
    import psycopg

    with psycopg.connect(libpq(url)) as db:
        for target, rows in tables:
            with db.cursor().copy(f"COPY {target} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        for table in names:
            db.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), max(id)) FROM {table}"
            )


def loadavg() -> str:
    """The machine's load averages (1, 5, 15 min) when a figure was taken, "" off Linux."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def progress(t0: float, what: str) -> None:
    """One line of a build's progress on stderr: seconds since ``t0``, ``what``."""
    print(f"build {time.perf_counter() - t0:7.0f} s: {what}", file=sys.stderr, flush=True)


def drain(url: str, flows: Path, n: int, concurrency: int, during=None) -> dict:
    """Start ``n`` noop instances and drain them with one daemon (``during``: a command
    line run meanwhile); transitions/s from the attempt rows."""
    from sqlalchemy import func, select

    from runner.flowspec.compiler import load_flow
    from runner.store.create import create_instances
    from runner.store.db import make_engine
    from runner.store.tables import attempts, instances

    engine = make_engine(url)
    flow = load_flow(flows / "noop.yaml")
    with engine.connect() as conn:
        after = conn.execute(select(func.coalesce(func.max(instances.c.id), 0))).scalar_one()
    with engine.begin() as conn:
        create_instances(conn, flow, [{"i": i} for i in range(n)])
    side = None
    proc = _daemon(url, flows, concurrency)
    if during is not None:
        time.sleep(0.5)
        t_side = time.perf_counter()
        side = subprocess.run(during, capture_output=True, text=True, cwd=flows.parent)
        side_s = time.perf_counter() - t_side
    proc.wait()
    with engine.connect() as conn:
        first, last, moved = conn.execute(
            select(
                func.min(attempts.c.started_at),
                func.max(attempts.c.finished_at),
                func.count(),
            ).where(attempts.c.instance_id > after, attempts.c.outcome == "moved")
        ).one()
    engine.dispose()
    out = {"transitions": moved, "per_s": round(moved / (last - first), 1), "loadavg": loadavg()}
    if side is not None:
        out["side"] = {"s": round(side_s, 1), "rc": side.returncode, "out": side.stdout.strip()}
    return out


def cli_ms(url: str, flows: Path, *args: str) -> float:
    """Best of 3 wall times of ``flowrun ARGS`` in ms (a whole process each)."""
    env = {**os.environ, "FLOWRUN_DB": url, "FLOWRUN_FLOWS": str(flows)}
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "runner.cli", *args], env=env, check=True, capture_output=True
        )
        best = min(best, (time.perf_counter() - t0) * 1000)
    return round(best, 1)


def reads(url: str, flows: Path) -> dict:
    from sqlalchemy import func, select

    from runner.store.db import make_engine
    from runner.store.tables import instances

    engine = make_engine(url)
    with engine.connect() as conn:
        iid = conn.execute(select(func.min(instances.c.id))).scalar_one()
    engine.dispose()
    if iid is None:
        return {}
    return {
        "ls_limit_50_ms": cli_ms(url, flows, "ls", "--limit", "50"),
        "show_ms": cli_ms(url, flows, "show", str(iid)),
        "explain_ms": cli_ms(url, flows, "explain", str(iid)),
        "events_limit_50_ms": cli_ms(url, flows, "events", "--limit", "50"),
        "loadavg": loadavg(),
    }


def size_of(url: str) -> int:
    from runner.store.db import make_engine
    from runner.store.space import database_bytes

    engine = make_engine(url)
    try:
        return database_bytes(engine)
    finally:
        engine.dispose()


def counts(url: str) -> dict:
    from sqlalchemy import text

    from runner.store.db import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        out = {
            t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("instances", "attempts", "events")
        }
    engine.dispose()
    return out


def vacuum_if_off(url: str) -> str:
    """PostgreSQL: ``"on"``, or ``"off: VACUUM ANALYZE after the build"`` when the server's
    ``autovacuum`` is off (a test server's setting). flowrun relies on autovacuum for
    the dead rows every update leaves (an instance is updated ~6 times on its way to
    ``completed``): without it a build of N instances leaves ~5N dead row versions and
    their entries in every index of ``instances``, which measures a server nobody should
    run, not big tables."""
    import psycopg

    conninfo = libpq(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        if row is not None and row[0] == "on":
            return "on"
        conn.execute("VACUUM ANALYZE")
    return "off: VACUUM ANALYZE after the build"


def libpq(url: str) -> str:
    """A SQLAlchemy ``postgresql+psycopg://`` URL as psycopg's own conninfo."""
    return url.replace("postgresql+psycopg://", "postgresql://")


@contextmanager
def autovacuum_on(url: str) -> Iterator[str | None]:
    """PostgreSQL: the server's ``autovacuum`` on for the block (``ALTER SYSTEM``, reloaded;
    put back as it was after), as flowrun runs in production (``docs/cli.md``, "Retention":
    it relies on autovacuum). A test server with it off measures the bloat of dead row
    versions (every update of an instance leaves one), which grows with time whether or not
    a prune runs. Yields what the report says; ``None`` and nothing done for SQLite."""
    if not url.startswith("postgresql"):
        yield None
        return
    import psycopg

    conninfo = libpq(url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        was_on = row is not None and row[0] == "on"
        if not was_on:
            conn.execute("ALTER SYSTEM SET autovacuum = on")
            conn.execute("SELECT pg_reload_conf()")
    try:
        yield "on" if was_on else "on for this run (the server's setting is off)"
    finally:
        if not was_on:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET autovacuum")
                conn.execute("SELECT pg_reload_conf()")


#: PostgreSQL databases this run made (dropped at the end unless ``--keep``).
MADE: list[str] = []


def _admin(admin_url: str, sql: str) -> None:
    import psycopg

    conninfo = libpq(admin_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql)


def pg_database(admin_url: str) -> str:
    name = f"flowrun_scale_{uuid.uuid4().hex[:8]}"
    _admin(admin_url, f'CREATE DATABASE "{name}"')
    MADE.append(name)
    return admin_url.rsplit("/", 1)[0] + "/" + name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=20_000, help="terminal instances of history")
    ap.add_argument("--new", type=int, default=20_000, help="new instances per drain")
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--keep", type=Path, help="build in this folder and keep it")
    ap.add_argument(
        "--build-only",
        action="store_true",
        help="only build the big database into --keep DIR (DIR/big, DIR/big/build.json)",
    )
    ap.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="DIR",
        help="measure a copy of the big database built into DIR (--build-only or --keep)",
    )
    ap.add_argument(
        "--no-prune",
        action="store_true",
        help="skip the prune under load (bench/prune_throughput.py covers a whole prune)",
    )
    ap.add_argument(
        "--parked", type=int, default=0, help="also: daemon RSS with N waiting + N sleeping"
    )
    a = ap.parse_args()
    if a.build_only and not a.keep:
        ap.error("--build-only needs --keep DIR")
    if a.build_only and a.source:
        ap.error("--build-only and --from exclude each other")
    if a.source:
        try:
            built = json.loads((a.source / "big" / BUILT).read_text())
        except FileNotFoundError:
            ap.error(f"--from {a.source}: no big/{BUILT} (build it with --build-only)")
        a.size, a.db = built["size"], built["db"]
        a.built = built
    try:
        if a.build_only:
            build_only(a)
        else:
            run(a)
    finally:
        if not a.keep and not a.build_only:
            for name in MADE:
                _admin(a.pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: What ``--build-only`` wrote, in ``DIR/big``: the database's URL and the build's figures.
BUILT = "build.json"


def prepare(home: Path) -> Path:
    """``home/flows`` with the bench's flows and tasks module; returns it."""
    flows = home / "flows"
    flows.mkdir(parents=True, exist_ok=True)
    (flows / "hist.yaml").write_text(HISTORY)
    (flows / "noop.yaml").write_text(NOOP)
    (flows / "scale_tasks.py").write_text(TASKS)
    return flows


def new_url(a: argparse.Namespace, home: Path) -> str:
    return f"sqlite:///{home / 'flowrun.db'}" if a.db == "sqlite" else pg_database(a.pg_url)


def build_big(a: argparse.Namespace, url: str, flows: Path) -> dict:
    """The big database's build and what it holds (rows, bytes)."""
    part: dict = {"build": build(url, flows, a.size, a.concurrency)}
    if a.db == "postgresql":
        part["autovacuum"] = vacuum_if_off(url)
    part["rows"] = counts(url)
    part["bytes_before"] = size_of(url)
    return part


def build_only(a: argparse.Namespace) -> None:
    """Build the big database into ``--keep``'s ``big`` folder and record it in
    ``big/build.json`` (read back by ``--from``)."""
    home = a.keep / "big"
    if (home / BUILT).exists():
        raise SystemExit(f"{home / BUILT} exists: a database is already built there")
    flows = prepare(home)
    url = new_url(a, home)
    part = build_big(a, url, flows)
    built = {"size": a.size, "db": a.db, "url": url, "concurrency": a.concurrency, **part}
    (home / BUILT).write_text(json.dumps(built, indent=2) + "\n")
    print(json.dumps(built, indent=2))


def copy_big(a: argparse.Namespace, work: Path) -> tuple[str, Path]:
    """A copy of ``--from``'s big database to measure (its build stays as built): the
    SQLite folder copied into ``work/big``, a PostgreSQL database made from the built one
    as its template. Returns the copy's URL and flows folder."""
    import shutil

    home = work / "big"
    if a.db == "sqlite":
        src = a.source / "big"
        if home.resolve() == src.resolve():
            raise SystemExit("--from DIR and --keep DIR must differ (the build is kept as built)")
        shutil.copytree(src, home, ignore=shutil.ignore_patterns(BUILT, "flows"))
        return f"sqlite:///{home / 'flowrun.db'}", prepare(home)
    built_name = a.built["url"].rsplit("/", 1)[1]
    name = f"flowrun_scale_{uuid.uuid4().hex[:8]}"
    _admin(a.pg_url, f'CREATE DATABASE "{name}" TEMPLATE "{built_name}"')
    MADE.append(name)
    return a.pg_url.rsplit("/", 1)[0] + "/" + name, prepare(home)


def run(a: argparse.Namespace) -> None:
    """Every measurement of ``main``'s arguments; prints the report. Without ``--keep``
    the temporary folder goes at the end (with ``--from``, a copy of the big database)."""
    if a.keep:
        measure(a, a.keep)
        return
    import shutil

    work = Path(tempfile.mkdtemp(prefix="flowrun-scale-"))
    try:
        measure(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(a: argparse.Namespace, work: Path) -> None:
    """:func:`run` in ``work``."""
    report: dict = {"size": a.size, "new": a.new, "db": a.db}
    if a.source:
        report["from"] = str(a.source)
    for label in ("empty", "big"):
        home = work / label
        part: dict = {}
        if label == "big" and a.source:
            t0 = time.perf_counter()
            url, flows = copy_big(a, work)
            part["copied_s"] = round(time.perf_counter() - t0, 1)
            part["build"] = a.built["build"]
            part["rows"] = counts(url)
            part["bytes_before"] = size_of(url)
        else:
            flows = prepare(home)
            url = new_url(a, home)
            if label == "big":
                part.update(build_big(a, url, flows))
        if label == "big":
            part["reads"] = reads(url, flows)
        part["noop"] = drain(url, flows, a.new, a.concurrency)
        if label == "big" and not a.no_prune:
            prune = [sys.executable, "-m", "runner.cli", "--db", url, "--flows", str(flows)]
            prune += ["prune", "--flow", "hist", "--older-than", "1s", "--json"]
            part["noop_during_prune"] = drain(url, flows, a.new, a.concurrency, during=prune)
            part["rows_after_prune"] = counts(url)
            t0 = time.perf_counter()
            events = [*prune[:-6], "--event-retention", "1s", "prune", "--json"]
            done = subprocess.run(events, capture_output=True, text=True, check=True)
            part["events_prune"] = {
                "s": round(time.perf_counter() - t0, 1),
                "out": json.loads(done.stdout)["events"],
                "loadavg": loadavg(),
            }
            part["bytes_after"] = size_of(url)
        report[label] = part
        print(json.dumps({label: part}), file=sys.stderr, flush=True)
    if a.parked:
        home = work / "parked"
        flows = home / "flows"
        flows.mkdir(parents=True, exist_ok=True)
        (flows / "scale_tasks.py").write_text(TASKS)
        url = new_url(a, home)
        r = rss_idle(url, flows, a.parked)
        r["bytes_per_instance"] = round(
            (r["rss_kib_parked"] - r["rss_kib_none"]) * 1024 / (2 * a.parked), 1
        )
        report["rss"] = r
    empty, big = report["empty"]["noop"]["per_s"], report["big"]["noop"]["per_s"]
    report["ratios"] = {"noop_big_vs_empty": round(big / empty, 3)}
    if not a.no_prune:
        during = report["big"]["noop_during_prune"]["per_s"]
        report["ratios"]["noop_during_prune_vs_empty"] = round(during / empty, 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
