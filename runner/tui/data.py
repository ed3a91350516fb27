"""The console's door to the database: ``ConsoleData`` (its read queries: pages, counts,
sparkline, workers, events, flows) and its one write path (``runner.ops.commands.submit``).

Every method here blocks on the database and is meant to run in a thread worker, never
on the UI loop. The instances view's page and counts live in ``runner.tui.paging`` (how
they stay cheap on a million instances); the values handed to screens in
``runner.tui.model``. The throughput sparkline's reads are
``runner.tui.spark``'s.

On SQLite, reads go through a second engine on the same file
(``runner.store.db.read_engine``) whose transactions are plain deferred ``BEGIN`` with
``query_only``: the runner's engine begins every transaction ``IMMEDIATE`` (a write
lock), which would make each console refresh queue behind, and block, the workers.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event, func, select

from runner.ops.detail import read_instance
from runner.ops.liveness import read_workers
from runner.ops.pools import read_pools
from runner.ops.queries import count_by_status, event_deliveries, shown_action
from runner.store.db import read_engine
from runner.store.tables import (
    commands,
    events,
    flow_versions,
    instances,
    sensors,
)
from runner.tui import literal
from runner.tui.model import Counts, Detail, FlowsInfo, Page, Query
from runner.tui.paging import read_counts, read_page
from runner.tui.spark import Sparkline

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.ops.commands import CommandResult
    from runner.ops.migrate import Migration


def _keep_undecodable(dbapi_connection: Any, _record: Any) -> None:
    """Read SQLite text that is not UTF-8 (written by another program: the runner
    itself stores only UTF-8) with its bytes kept as surrogates, which
    ``runner.tui.literal`` shows as ``\\xNN``, instead of failing the whole read."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.text_factory = _lenient_text


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class ConsoleData:
    """The console's access to the database: reads through a read-only engine, commands
    through ``runner.ops.commands.submit`` (the same path as the CLI).

    Args:
        engine: the runner's engine (commands are written through it).
        clock: seconds since the epoch (injected: tests use a fixed clock).
        flows_dir: the flows folder, for the flows view (optional).

    Unless a method says otherwise, it raises ``sqlalchemy.exc.SQLAlchemyError`` when the
    database cannot be read, and nothing else.
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
        if self.reader is not engine:  # our own SQLite sibling: text another program
            event.listen(self.reader, "connect", _keep_undecodable)  # wrote stays readable
        self.clock = clock
        self.flows_dir = Path(flows_dir) if flows_dir else None
        self._policies: dict[tuple[str, str], tuple[int, float] | None] = {}
        self._waits: dict[tuple[str, str], tuple[str, ...] | None] = {}
        self._lock = threading.Lock()
        self._spark = Sparkline()
        self._spark_lock = threading.Lock()  # looks from overlapping refresh workers

    def close(self) -> None:
        """Dispose of the read engine (when it is our own); raises nothing."""
        if self.reader is not self.engine:
            self.reader.dispose()

    # -- instances (``runner.tui.paging``) -----------------------------------------

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
        shown before) lets an ``id`` order continue by key from a row it holds. Each row
        carries its state's error budget (``policy``). Raises ``SQLAlchemyError`` when
        the database cannot be read.
        """
        return read_page(
            self.reader,
            q,
            offset,
            limit,
            total=total,
            anchor=anchor,
            policy=self.policy,
            waits=self.waits_for,
        )

    def count_by_status(self, flow: str | None = None) -> dict[str, int]:
        """``{status: count}`` for every status (zeros included), optionally for one flow;
        raises ``SQLAlchemyError`` when the database cannot be read."""
        return count_by_status(self.reader, flow)

    def counts(self, q: Query) -> Counts:
        """Counts per status in ``q``'s flow scope and the number of rows ``q`` matches;
        raises ``SQLAlchemyError`` when the database cannot be read."""
        return read_counts(self.reader, q)

    def throughput(self, now: float, seconds: int = 60) -> list[int]:
        """Attempts finished in each of the ``seconds`` whole seconds before ``now``
        (epoch seconds), oldest first (``runner.tui.spark``: each look reads only the
        rows written since the earlier ones)."""
        with self._spark_lock, self.reader.connect() as conn:
            return self._spark.look(conn, now, seconds)

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

    def empty_hint(self, q: Query) -> str:
        """What the instances table says when ``q`` matches nothing: clear the filters,
        start an instance, or (no flow file in the flows folder) write a flow first."""
        if q.status or q.flow or q.text:
            return "no instances match the filters (c clears them)"
        folder = Path(self.flows_dir) if self.flows_dir is not None else None
        if folder is not None and not any(
            p.suffix in (".yaml", ".yml") for p in (folder.iterdir() if folder.is_dir() else ())
        ):
            return (
                f"no flows in {folder}: run `flowrun init` for an example, or write a flow "
                "file there, then restart the console"
            )
        return "no instances yet: `flowrun start FLOW`, or let a sensor start one"

    # -- policies and compiled flows -------------------------------------------------

    def compiled(self, version: str) -> CompiledFlow:
        """The ``CompiledFlow`` of a stored version (``runner.store.versions.compiled``, cached).

        Raises:
            UserError: the version is not stored or no longer compiles.
        """
        from runner.store.versions import compiled

        return compiled(self.engine, version)

    def _of_state(
        self, cache: dict[tuple[str, str], Any], version: str, state: str, read: Callable[..., Any]
    ) -> Any:
        """``read(compiled state)`` for ``state`` of ``version``, cached in ``cache``;
        ``None`` when the version or state is unknown or does not compile (raises nothing)."""
        key = (version, state)
        if key in cache:
            return cache[key]
        value = None
        try:
            st = self.compiled(version).states.get(state)
            if st is not None:
                value = read(st)
        except Exception:  # not stored, not compilable, or no compiler yet
            value = None
        with self._lock:
            cache[key] = value
        return value

    def policy(self, version: str, state: str) -> tuple[int, float] | None:
        """``(max_errors, window seconds)`` of a state's error budget, or ``None`` when
        the version or state is unknown or does not compile (cached; raises nothing)."""
        return self._of_state(
            self._policies,
            version,
            state,
            lambda st: (int(st.policy.max_errors), float(st.policy.window)),
        )

    def waits_for(self, version: str, state: str) -> tuple[str, ...] | None:
        """The ``on:`` events of ``state`` when it is external (moved by events only), or
        ``None`` when it is not, or the version or state is unknown or does not compile
        (cached; raises nothing)."""
        return self._of_state(
            self._waits,
            version,
            state,
            lambda st: tuple(st.on or {}) if st.kind == "external" else None,
        )

    # -- one instance ----------------------------------------------------------------

    def explain(self, instance_id: int) -> str | None:
        """The text of ``flowrun explain`` for one instance (``runner.ops.explain``), or
        ``None`` when there is no such id."""
        from runner.ops.detail import instance_rows
        from runner.ops.explain import explain
        from runner.ops.explanation import render_text

        rows = instance_rows(self.reader, instance_id)
        if rows is None:
            return None
        now = self.clock()
        return render_text(explain(rows, self.compiled, now), now)

    def detail(self, instance_id: int, *, history: int = 200) -> Detail | None:
        """One instance with its last ``history`` attempts and last 50 commands (newest
        first; ``runner.ops.detail.read_instance``, as ``flowrun show``), or ``None``
        when there is no such id. A flow version that cannot be compiled is reported in
        ``Detail.flow_error``, never raised."""
        rec = read_instance(self.reader, instance_id, history=history, commands_limit=50)
        if rec is None:
            return None
        d = Detail(rec.row, rec.attempts, rec.commands)
        try:
            d.flow = self.compiled(rec.row["version"])
            st = d.flow.states.get(rec.row["state"])
            d.policy = st.policy if st is not None else None
        except Exception as exc:  # shown on the screen, never raised
            d.flow_error = literal.one_line(str(exc)) or type(exc).__name__
        return d

    # -- other views -----------------------------------------------------------------

    def workers(self) -> list[dict[str, Any]]:
        """Workers (their ``workers`` rows, newest heartbeat first) with the liveness
        verdict at the console's clock and ``holding`` (the attempts each runs now):
        ``runner.ops.liveness.read_workers``, the same as ``flowrun workers``."""
        return read_workers(self.reader, now=self.clock())

    def pools(self) -> list[dict[str, Any]]:
        """Pools with their slots, slots in use, holders, waiters and rates at the
        console's clock: ``runner.ops.pools.read_pools``, the same as ``flowrun pool ls``."""
        return read_pools(self.reader, now=self.clock())

    def events(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest ``limit`` sensor events (rows, newest first) with what the rules did
        and their ``deliveries`` (``runner.ops.queries.event_deliveries``: a rule's
        ``exec``/``webhook`` and what became of it)."""
        left = (
            select(func.count())
            .where(instances.c.event_id == events.c.id)
            .scalar_subquery()
            .label("instances_left")
        )
        with self.reader.connect() as conn:
            stmt = select(events, left).order_by(events.c.id.desc()).limit(limit)
            rows = [dict(r) for r in conn.execute(stmt).mappings()]
        for r in rows:  # no action naming an instance that was pruned
            r["action"] = shown_action(r["action"], r.pop("instances_left"))
        by_event = event_deliveries(self.reader, [r["id"] for r in rows])
        for r in rows:
            r["deliveries"] = by_event.get(r["id"], [])
        return rows

    def sensors(self) -> list[dict[str, Any]]:
        """Every sensor's lease and cursor."""
        with self.reader.connect() as conn:
            stmt = select(sensors).order_by(sensors.c.name)
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def commands_log(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest ``limit`` commands (operator, CLI and rule; rows, newest first),
        applied or refused."""
        with self.reader.connect() as conn:
            stmt = select(commands).order_by(commands.c.id.desc()).limit(limit)
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def flows(self) -> FlowsInfo:
        """Flows loaded from the flows folder (with errors) and stored flow versions.

        A folder that cannot be loaded is reported in ``FlowsInfo.note``, never raised.
        """
        info = FlowsInfo()
        if self.flows_dir is not None:
            try:
                from runner.flowspec.registry import FlowRegistry

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
                info.note = "flow registry not available (runner.flowspec.registry)"
            except Exception as exc:  # a broken folder is shown, never raised
                info.note = f"cannot load {self.flows_dir}: {literal.one_line(str(exc))}"
        else:
            info.note = "no flows folder given: showing stored versions only"
        fv = flow_versions.c
        with self.reader.connect() as conn:
            stmt = select(fv.version, fv.flow, fv.path, fv.loaded_at).order_by(
                fv.flow, fv.loaded_at.desc()
            )
            info.versions = [dict(r) for r in conn.execute(stmt).mappings()]
        from runner.ops.migrate import instances_per_version

        per_version = instances_per_version(self.reader)
        for v in info.versions:
            v["instances"] = per_version.get(v["version"], {})
        return info

    def migrate_to_loaded(self, flow: str) -> list[Migration]:
        """Migrate every unfinished instance of ``flow`` to the version loaded from the
        flows folder now (``runner.ops.migrate``, source ``tui``); returns one
        ``Migration`` per instance considered.

        Raises:
            UserError: no flows folder, or ``flow`` is not loaded from it.
        """
        from runner.errors import UserError
        from runner.flowspec.registry import FlowRegistry
        from runner.ops.migrate import migrate
        from runner.store.create import record_version

        if self.flows_dir is None:
            raise UserError("no flows folder: no latest version to migrate to", 2)
        registry = FlowRegistry(self.flows_dir)
        registry.load_all()
        loaded = registry.get(flow)
        with self.engine.begin() as conn:
            record_version(conn, loaded)
        return migrate(self.engine, flow, loaded.version, source="tui")

    # -- commands --------------------------------------------------------------------

    def allowed_events(self, ids: Iterable[int]) -> list[str]:
        """Events every one of ``ids`` (the first 50) accepts in its current state (sorted).

        Raises:
            UserError: an id is unknown, or its flow version is not stored or no longer
                compiles.
        """
        from runner.ops.commands import allowed_events

        common: set[str] | None = None
        for iid in list(ids)[:50]:
            evs = set(allowed_events(self.engine, iid))
            common = evs if common is None else common & evs
        return sorted(common or ())

    def submit(
        self,
        ids: Sequence[int],
        command: str,
        event: str | None = None,
        *,
        until: float | None = None,
    ) -> list[CommandResult]:
        """Apply ``command`` (pause, resume, kill, retry, send, sleep, wake) to ``ids`` through
        ``runner.ops.commands.submit`` (source ``tui``) in one transaction; returns one
        ``CommandResult`` per distinct id (a refusal is a result, not an exception).
        ``event`` is the event for ``send``; ``until`` the wake time of ``sleep`` (epoch s).

        Raises:
            UserError: an unknown command, or ``send`` without an event.
            sqlalchemy.exc.SQLAlchemyError: the database cannot be written.
        """
        from runner.ops.commands import submit

        return submit(self.engine, list(ids), command, event=event, source="tui", until=until)
