"""The console's read queries (pages, counts, sparkline, workers, events, flows) and its
one write path (``runner.commands.submit``).

Every method here blocks on the database and is meant to run in a thread worker, never
on the UI loop. Queries stay cheap on a million instances:

* a page is read in two steps: the ids of the page (``LIMIT``/``OFFSET`` over an index
  that covers the order: the rowid for ``id``, ``ix_instances_flow_status`` for ``flow``,
  ``ix_instances_claim`` for ``status`` and for ``due`` under a status filter), then the
  few rows by id;
* counts per status are one ``count(*)`` per status, each a range of
  ``ix_instances_claim`` (faster on SQLite than ``GROUP BY status`` over the same index:
  59 ms against 94 ms at 1M rows), run on their own slower cadence;
* the throughput sparkline reads only the last ``SPARK_LOOKBACK`` attempt ids (rowid
  range) instead of scanning ``attempts`` for ``finished_at``, which has no index.

On SQLite, reads go through a second engine on the same file whose transactions are
plain deferred ``BEGIN`` with ``query_only``: the runner's engine begins every
transaction ``IMMEDIATE`` (a write lock), which would make each console refresh queue
behind, and block, the workers. Under WAL a deferred read never blocks a writer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, String, cast, create_engine, event, func, or_, select
from sqlalchemy.sql import ColumnElement

from ..models import (
    STATUSES,
    attempts,
    commands,
    events,
    flow_versions,
    instances,
    sensors,
    workers,
)
from . import fmt

#: How many of the newest attempt rows the sparkline looks at.
SPARK_LOOKBACK = 50_000
#: Above this many matching rows, an ``id`` order scans the rowid instead of sorting.
ROWID_SCAN_ABOVE = 20_000

#: Sort keys offered by the console, in the order ``o`` cycles through them.
SORTS = ("id", "flow", "state", "status", "attempts", "restarts", "errors", "due")

_ROW_COLS = (
    instances.c.id,
    instances.c.flow,
    instances.c.version,
    instances.c.state,
    instances.c.status,
    instances.c.locked_by,
    instances.c.locked_until,
    instances.c.attempts,
    instances.c.errors,
    instances.c.restarts,
    instances.c.state_errors,
    instances.c.due_at,
    instances.c.last_error,
)


@dataclass(frozen=True)
class Query:
    """What the instances view shows: filters and order."""

    status: str | None = None
    flow: str | None = None
    text: str = ""
    sort: str = "id"
    desc: bool = False

    def with_(self, **changes: Any) -> Query:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Row:
    """One instance as the instances view needs it (raw values, formatted at render)."""

    id: int
    flow: str
    version: str
    state: str
    status: str
    locked_by: str | None
    locked_until: float | None
    attempts: int
    errors: int
    restarts: int
    state_errors: tuple[float, ...]
    due_at: float | None
    last_error: str | None
    max_errors: int | None = None
    window: float | None = None


@dataclass
class Page:
    """Rows ``offset .. offset+len(rows)`` of ``query``'s ordering."""

    query: Query
    offset: int
    rows: list[Row]
    limit: int
    elapsed: float = 0.0

    def get(self, index: int) -> Row | None:
        """The row at absolute position ``index`` when this page holds it."""
        i = index - self.offset
        return self.rows[i] if 0 <= i < len(self.rows) else None

    def nearest_before(self, index: int) -> tuple[int, int] | None:
        """``(position, id)`` of the held row closest before ``index`` (within 2 pages)."""
        if not self.rows or index <= self.offset:
            return None
        pos = min(index - 1, self.offset + len(self.rows) - 1)
        if index - pos > 2 * max(self.limit, 1):
            return None
        return pos, self.rows[pos - self.offset].id

    @property
    def exhausted(self) -> bool:
        """True when the page ended before its limit: nothing follows it."""
        return len(self.rows) < self.limit


@dataclass
class Counts:
    """Counts per status in the current flow scope and the total matching the filters."""

    by_status: dict[str, int]
    total: int
    elapsed: float = 0.0


@dataclass
class Detail:
    """Everything the detail screen shows about one instance."""

    row: dict[str, Any]
    attempts: list[dict[str, Any]]
    commands: list[dict[str, Any]]
    flow: Any = None
    flow_error: str | None = None
    policy: Any = None


@dataclass
class FlowsInfo:
    """Loaded flows (from the flows folder) and stored flow versions."""

    loaded: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None


def read_engine(engine: Engine) -> Engine:
    """An engine for reads that never takes SQLite's write lock (see module docstring).

    For PostgreSQL, and for SQLite in memory, the engine itself is returned.
    """
    if engine.dialect.name != "sqlite":
        return engine
    database = engine.url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return engine
    reader = create_engine(engine.url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(reader, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - trivial
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA query_only=ON")
        cur.close()

    @event.listens_for(reader, "begin")
    def _on_begin(conn):  # pragma: no cover - trivial
        conn.exec_driver_sql("BEGIN")

    return reader


class ConsoleData:
    """The console's access to the database: reads through a read-only engine, commands
    through ``runner.commands.submit`` (the same path as the CLI).

    Args:
        engine: the runner's engine (commands are written through it).
        clock: seconds since the epoch (injected: tests use a fixed clock).
        flows_dir: the flows folder, for the flows view (optional).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], float] = time.time,
        flows_dir: str | Path | None = None,
    ) -> None:
        self.engine = engine
        self.reader = read_engine(engine)
        self.clock = clock
        self.flows_dir = Path(flows_dir) if flows_dir else None
        self._policies: dict[tuple[str, str], tuple[int, float] | None] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Dispose of the read engine (when it is our own)."""
        if self.reader is not self.engine:
            self.reader.dispose()

    # -- instances ------------------------------------------------------------------

    def _where(self, q: Query, *, rowid_scan: bool = False) -> list[ColumnElement]:
        c = instances.c
        # ``col || ''`` hides an index from SQLite's planner, so an id order walks the
        # rowid and stops after the page instead of sorting every matching id.
        status = (c.status + "") if rowid_scan else c.status
        flow = (c.flow + "") if rowid_scan else c.flow
        clauses: list[ColumnElement] = []
        if q.status:
            clauses.append(status == q.status)
        if q.flow:
            clauses.append(flow == q.flow)
        if q.text:
            like = f"%{q.text.lower()}%"
            ors = [
                func.lower(c.flow).like(like),
                func.lower(c.state).like(like),
                func.lower(c.status).like(like),
                func.lower(func.coalesce(c.last_error, "")).like(like),
                func.lower(cast(c.data, String)).like(like),
            ]
            if q.text.strip().isdigit():
                ors.append(c.id == int(q.text.strip()))
            clauses.append(or_(*ors))
        return clauses

    @staticmethod
    def _order(q: Query) -> list[ColumnElement]:
        c = instances.c
        cols = {
            "id": [c.id],
            "flow": [c.flow, c.status, c.id],
            "status": [c.status, c.due_at, c.id],
            "due": [c.due_at, c.id],
            "state": [c.state, c.id],
            "attempts": [c.attempts, c.id],
            "restarts": [c.restarts, c.id],
            "errors": [c.errors, c.id],
        }.get(q.sort, [c.id])
        return [col.desc() for col in cols] if q.desc else [col.asc() for col in cols]

    def page(
        self,
        q: Query,
        offset: int,
        limit: int,
        *,
        total: int | None = None,
        anchor: Page | None = None,
    ) -> Page:
        """Rows ``offset .. offset+limit`` of the instances matching ``q``, in its order.

        ``total`` (the last known count of matching rows) lets an ``id`` order under a
        broad filter walk the rowid rather than sort every match. ``anchor`` (the page
        shown before) lets an ``id`` order continue by key from a row it holds.
        """
        t0 = time.perf_counter()
        offset = max(0, offset)
        rowid_scan = (
            self.reader.dialect.name == "sqlite"
            and q.sort == "id"
            and bool(q.status or q.flow)
            and not q.text
            and (total is None or total > ROWID_SCAN_ABOVE)
        )
        where = self._where(q, rowid_scan=rowid_scan)
        skip = offset
        if q.sort == "id" and anchor is not None and anchor.query == q:
            # Keyset: continue from the nearest row we already hold before ``offset``,
            # so scrolling costs the page, not the depth.
            near = anchor.nearest_before(offset)
            if near is not None:
                pos, key = near
                where.append(instances.c.id < key if q.desc else instances.c.id > key)
                skip = offset - pos - 1
        ids_q = (
            select(instances.c.id).where(*where).order_by(*self._order(q)).limit(limit).offset(skip)
        )
        with self.reader.connect() as conn:
            plain = q.sort == "id" and not (q.status or q.flow or q.text)
            if skip == offset and offset and plain and total:
                jump = self._dense_jump(conn, q, offset, limit, total)
                if jump is not None:
                    ids_q = jump
            ids = list(conn.execute(ids_q).scalars())
            by_id = {}
            if ids:
                for r in conn.execute(select(*_ROW_COLS).where(instances.c.id.in_(ids))):
                    by_id[r.id] = r
        rows = []
        for iid in ids:
            r = by_id.get(iid)
            if r is None:
                continue
            pol = self.policy(r.version, r.state)
            rows.append(
                Row(
                    id=r.id,
                    flow=r.flow,
                    version=r.version,
                    state=r.state,
                    status=r.status,
                    locked_by=r.locked_by,
                    locked_until=r.locked_until,
                    attempts=r.attempts,
                    errors=r.errors,
                    restarts=r.restarts,
                    state_errors=tuple(r.state_errors or ()),
                    due_at=r.due_at,
                    last_error=r.last_error,
                    max_errors=pol[0] if pol else None,
                    window=pol[1] if pol else None,
                )
            )
        return Page(q, offset, rows, limit, time.perf_counter() - t0)

    @staticmethod
    def _dense_jump(conn: Any, q: Query, offset: int, limit: int, total: int) -> Any:
        """For an unfiltered ``id`` order over gap-free ids (``max - min + 1`` equals the
        known ``total``), position by key instead of walking ``offset`` rows."""
        # two statements: SQLite answers a lone min() or max() from the b-tree edge
        lo = conn.execute(select(func.min(instances.c.id))).scalar()
        hi = conn.execute(select(func.max(instances.c.id))).scalar()
        if lo is None or hi - lo + 1 != total:
            return None
        c = instances.c
        if q.desc:
            return select(c.id).where(c.id <= hi - offset).order_by(c.id.desc()).limit(limit)
        return select(c.id).where(c.id >= lo + offset).order_by(c.id).limit(limit)

    def count_by_status(self, flow: str | None = None) -> dict[str, int]:
        """``{status: count}`` for every status (zeros included), optionally for one flow."""
        c = instances.c
        subs = []
        for status in STATUSES:
            s = select(func.count()).select_from(instances).where(c.status == status)
            if flow:
                s = s.where(c.flow == flow)
            subs.append(s.scalar_subquery().label(status))
        with self.reader.connect() as conn:
            row = conn.execute(select(*subs)).one()
        return {status: int(row[i] or 0) for i, status in enumerate(STATUSES)}

    def counts(self, q: Query) -> Counts:
        """Counts per status in ``q``'s flow scope and the number of rows ``q`` matches."""
        t0 = time.perf_counter()
        by_status = self.count_by_status(q.flow)
        if q.text:
            stmt = select(func.count()).select_from(instances).where(*self._where(q))
            with self.reader.connect() as conn:
                total = int(conn.execute(stmt).scalar_one())
        elif q.status:
            total = by_status.get(q.status, 0)
        else:
            total = sum(by_status.values())
        return Counts(by_status, total, time.perf_counter() - t0)

    def throughput(self, now: float, seconds: int = 60) -> list[int]:
        """Attempts finished per second over the last ``seconds`` (oldest first)."""
        since = now - seconds
        a = attempts.c
        top = select(func.max(a.id)).scalar_subquery()
        stmt = select(a.finished_at).where(
            a.id > top - SPARK_LOOKBACK, a.finished_at >= since, a.finished_at < now
        )
        buckets = [0] * seconds
        with self.reader.connect() as conn:
            for (fin,) in conn.execute(stmt):
                i = int(fin - since)
                if 0 <= i < seconds:
                    buckets[i] += 1
        return buckets

    def statuses(self, ids: Sequence[int]) -> dict[int, str]:
        """``{id: status}`` of the given instances (unknown ids are left out)."""
        out: dict[int, str] = {}
        with self.reader.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = list(ids[i : i + 500])
                stmt = select(instances.c.id, instances.c.status).where(instances.c.id.in_(chunk))
                out.update(dict(conn.execute(stmt).all()))
        return out

    def flow_names(self) -> list[str]:
        """Names of the flows known to the database (stored versions, else instances)."""
        with self.reader.connect() as conn:
            names = set(conn.execute(select(flow_versions.c.flow).distinct()).scalars())
            if not names:
                names = set(conn.execute(select(instances.c.flow).distinct()).scalars())
        return sorted(names)

    # -- policies and compiled flows -------------------------------------------------

    def compiled(self, version: str) -> Any:
        """The ``CompiledFlow`` of a stored version (``runner.versions.compiled``)."""
        from ..versions import compiled

        return compiled(self.engine, version)

    def policy(self, version: str, state: str) -> tuple[int, float] | None:
        """``(max_errors, window)`` of a state's error budget, or ``None`` if unknown."""
        key = (version, state)
        if key in self._policies:
            return self._policies[key]
        pol: tuple[int, float] | None = None
        try:
            st = self.compiled(version).states.get(state)
            if st is not None:
                pol = (int(st.policy.max_errors), float(st.policy.window))
        except Exception:  # not stored, not compilable, or no compiler yet
            pol = None
        with self._lock:
            self._policies[key] = pol
        return pol

    # -- one instance ----------------------------------------------------------------

    def detail(self, instance_id: int, *, history: int = 200) -> Detail | None:
        """One instance with its last ``history`` attempts and last 50 commands."""
        a, cm = attempts.c, commands.c
        with self.reader.connect() as conn:
            row = (
                conn.execute(select(instances).where(instances.c.id == instance_id))
                .mappings()
                .first()
            )
            if row is None:
                return None
            att = (
                conn.execute(
                    select(attempts)
                    .where(a.instance_id == instance_id)
                    .order_by(a.id.desc())
                    .limit(history)
                )
                .mappings()
                .all()
            )
            cmds = (
                conn.execute(
                    select(commands)
                    .where(cm.instance_id == instance_id)
                    .order_by(cm.id.desc())
                    .limit(50)
                )
                .mappings()
                .all()
            )
        d = Detail(dict(row), [dict(x) for x in att], [dict(x) for x in cmds])
        try:
            d.flow = self.compiled(row["version"])
            st = d.flow.states.get(row["state"])
            d.policy = st.policy if st is not None else None
        except Exception as exc:  # shown on the screen, never raised
            d.flow_error = fmt.one_line(str(exc)) or type(exc).__name__
        return d

    # -- other views -----------------------------------------------------------------

    def workers(self) -> list[dict[str, Any]]:
        """Workers with their heartbeat and the attempts they hold right now."""
        w, c = workers.c, instances.c
        with self.reader.connect() as conn:
            rows = [dict(r) for r in conn.execute(select(workers).order_by(w.id)).mappings()]
            held = dict(
                conn.execute(
                    select(c.locked_by, func.count())
                    .where(c.locked_by.is_not(None), c.running_attempt.is_not(None))
                    .group_by(c.locked_by)
                ).all()
            )
        for r in rows:
            r["holding"] = int(held.get(r["id"], 0))
        return rows

    def events(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest sensor events with what the rules did."""
        with self.reader.connect() as conn:
            stmt = select(events).order_by(events.c.id.desc()).limit(limit)
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def sensors(self) -> list[dict[str, Any]]:
        """Every sensor's lease and cursor."""
        with self.reader.connect() as conn:
            stmt = select(sensors).order_by(sensors.c.name)
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def commands_log(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest commands (operator, CLI and rule), applied or refused."""
        with self.reader.connect() as conn:
            stmt = select(commands).order_by(commands.c.id.desc()).limit(limit)
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def flows(self) -> FlowsInfo:
        """Flows loaded from the flows folder (with errors) and stored flow versions."""
        info = FlowsInfo()
        if self.flows_dir is not None:
            try:
                from ..flows import FlowRegistry

                reg = FlowRegistry(self.flows_dir)
                errs = reg.load_all()
                for name, flow in sorted(reg.flows.items()):
                    info.loaded.append(
                        {
                            "name": name,
                            "version": flow.version,
                            "states": len(flow.states),
                            "sensors": len(flow.sensors),
                            "rules": len(flow.rules),
                            "path": str(flow.path),
                        }
                    )
                seen = {str(e) for e in errs}
                info.errors = sorted(seen | {str(e) for v in reg.errors.values() for e in v})
            except ImportError:
                info.note = "flow registry not available (runner.flows)"
            except Exception as exc:  # a broken folder is shown, never raised
                info.note = f"cannot load {self.flows_dir}: {fmt.one_line(str(exc))}"
        else:
            info.note = "no flows folder given: showing stored versions only"
        fv = flow_versions.c
        with self.reader.connect() as conn:
            stmt = select(fv.version, fv.flow, fv.path, fv.loaded_at).order_by(
                fv.flow, fv.loaded_at.desc()
            )
            info.versions = [dict(r) for r in conn.execute(stmt).mappings()]
        return info

    # -- commands --------------------------------------------------------------------

    def allowed_events(self, ids: Iterable[int]) -> list[str]:
        """Events every one of ``ids`` accepts in its current state (sorted)."""
        from ..commands import allowed_events

        common: set[str] | None = None
        for iid in list(ids)[:50]:
            evs = set(allowed_events(self.engine, iid))
            common = evs if common is None else common & evs
        return sorted(common or ())

    def submit(self, ids: Sequence[int], command: str, event: str | None = None) -> list[Any]:
        """Apply ``command`` through ``runner.commands.submit`` (source ``tui``)."""
        from ..commands import submit

        return submit(self.engine, list(ids), command, event=event, source="tui")
