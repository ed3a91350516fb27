"""One prune: everything retention lets go, in short paced transactions.

``flowrun prune`` runs :func:`prune` once; the daemon's pruner
(``runner.service.pruner``) runs it every few minutes under a lease. Both decide by the
same :class:`runner.retention.Rules` (:func:`rules_for` builds them from the loaded flows)
and delete through ``runner.store.prune``. The order matters: instances first (their
attempts, checkpoints, kept stderr tails and commands go with them), then the old
history of live instances, then the events no instance refers to any more, silent
workers, and flow versions no instance is on.

Writes go in transactions of about :attr:`Pacing.batch` rows, each followed by a rest
proportional to its length (:attr:`Pacing.rest`), so workers sharing the database (on
SQLite, the one writer at a time) wait little for it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine

from runner.retention import DEFAULT, EVENT_WINDOW, KINDS, Retention, Rules, cut_attempt
from runner.store import prune as sql
from runner.store import prune_instances
from runner.store.clock import db_now
from runner.store.dialect import dialect_of

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

#: Rows read per look at the attempts and events tables.
READ_ROWS = 2000


@dataclass
class Pacing:
    """How a prune shares the database.

    Attributes:
        batch: rows written per transaction, about (an instance's child rows go in its
            transaction; the number of instances per transaction follows the rows per
            instance of the last one). ``None``: :func:`default_batch` of the database.
        rest: after a write transaction of ``t`` seconds, sleep ``rest * t`` (at least
            ``min_rest``): the pruner holds the database at most ``1 / (1 + rest)`` of
            the time. ``None``: :func:`default_rest` of the database.
        sleep: the sleep function (the daemon passes one that a stop interrupts).
        stopped: asked between transactions; ``True`` ends the prune early.
    """

    batch: int | None = None
    rest: float | None = None
    min_rest: float = 0.002
    sleep: Callable[[float], Any] = time.sleep
    stopped: Callable[[], bool] = lambda: False


@dataclass
class _Run:
    """One prune's state: the counts, and in a dry run what it would have deleted (the
    events and versions those instances referred to count as gone)."""

    engine: Engine
    rules: Rules
    now: float
    dry_run: bool
    pacing: Pacing
    on_step: Callable[[Counter[str]], None] | None
    counts: Counter[str] = field(default_factory=Counter)
    gone_events: Counter[int] = field(default_factory=Counter)
    gone_versions: Counter[str] = field(default_factory=Counter)

    @property
    def batch(self) -> int:
        """Rows per transaction (``prune`` resolves :attr:`Pacing.batch` before the run)."""
        assert self.pacing.batch is not None
        return self.pacing.batch

    @property
    def rest(self) -> float:
        """The rest after a transaction, per second of it (resolved before the run)."""
        assert self.pacing.rest is not None
        return self.pacing.rest

    def wrote(self, step: Callable[[], Counter[str] | int], kind: str | None = None) -> None:
        """Run one write ``step`` (its counts, or an int of ``kind``), count it, rest."""
        t0 = time.monotonic()
        got = step()
        took = time.monotonic() - t0
        if isinstance(got, int):
            got = Counter({cast(str, kind): got}) if got else Counter()  # an int names its kind
        self.counts.update(got)
        if got and self.on_step is not None:
            self.on_step(got)
        if not self.dry_run:
            self.pacing.sleep(max(self.pacing.min_rest, took * self.rest))

    def pages(
        self, read: Callable[[int], list[tuple[Any, ...]]]
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows ``read(after)`` gives page by page (keyset: ``after`` is the first
        column of the last row read), until it gives none or the prune is stopped."""
        after = 0
        while not self.pacing.stopped():
            rows = read(after)
            if not rows:
                return
            after = rows[-1][0]
            yield rows

    def in_batches(
        self,
        items: list[Any],
        step: Callable[[list[Any]], Counter[str] | int],
        kind: str | None = None,
    ) -> None:
        """:meth:`wrote` ``step`` on each :attr:`Pacing.batch` of ``items`` in turn."""
        size = self.batch
        for i in range(0, len(items), size):
            self.wrote(partial(step, items[i : i + size]), kind)


#: Rows per write transaction by default: on SQLite (one writer at a time: a worker's
#: claim waits for the whole transaction, then for SQLite's busy-wait steps of 1, 2, 5,
#: 10, 15... ms) a short one; with row locks (PostgreSQL) the longer one.
BATCH_SERIAL, BATCH = 100, 500


def default_batch(engine: Engine) -> int:
    """Rows per write transaction on ``engine``'s database: :data:`BATCH_SERIAL` where
    one write transaction holds the whole database (``Dialect.serial_writes``), else
    :data:`BATCH`."""
    return BATCH_SERIAL if dialect_of(engine).serial_writes else BATCH


#: Rest after a write transaction, per second of it, by default. SQLite: the claims wait
#: for the write lock, so the rest is their turn. PostgreSQL: no claim waits for the
#: pruner's row locks; what they share is the machine: with a rest of 3 the server's
#: work for a prune raised the claim latency's p99 on the 2-core machine 1.41-1.42×,
#: with 9 0.98-1.02× (``docs/performance.md``, "Prune batches compiled once").
REST_SERIAL, REST = 3.0, 9.0


def default_rest(engine: Engine) -> float:
    """:attr:`Pacing.rest` on ``engine``'s database: :data:`REST_SERIAL` where one write
    transaction holds the whole database, else :data:`REST`."""
    return REST_SERIAL if dialect_of(engine).serial_writes else REST


def resolved(pacing: Pacing | None, engine: Engine) -> Pacing:
    """``pacing`` (default: :class:`Pacing`) with its batch and rest set for ``engine``'s
    database where they are ``None``."""
    pacing = pacing or Pacing()
    if pacing.batch is None:
        pacing = replace(pacing, batch=default_batch(engine))
    if pacing.rest is None:
        pacing = replace(pacing, rest=default_rest(engine))
    return pacing


def rules_for(
    flows: Iterable[CompiledFlow],
    default: Retention = DEFAULT,
    *,
    events: float | None = EVENT_WINDOW,
    older_than: float | None = None,
    log_store_max: int | None = None,
) -> Rules:
    """The :class:`Rules` of a set of loaded flows (``CompiledFlow``: those whose file
    sets ``retention`` get their own policy; their versions are current);
    ``log_store_max`` bytes bound the attempt logs (``None``: no bound)."""
    flows = list(flows)
    own = {
        f.name: default.over(f.spec.retention.overrides())
        for f in flows
        if f.spec is not None and f.spec.retention is not None
    }
    return Rules(
        default=default,
        flows=own,
        events=events,
        current=frozenset(f.version for f in flows),
        older_than=older_than,
        log_store_max=log_store_max,
    )


def prune(
    engine: Engine,
    rules: Rules,
    *,
    now: float | None = None,
    flow: str | None = None,
    dry_run: bool = False,
    pacing: Pacing | None = None,
    on_step: Callable[[Counter[str]], None] | None = None,
) -> dict[str, int]:
    """Delete (``dry_run``: count) what ``rules`` let go at ``now`` (epoch seconds UTC,
    default the database's clock now: ``runner.store.clock.db_now``).

    Args:
        flow: only this flow's instances, history and versions (events and workers are
            left alone).
        on_step: called after each transaction with what it deleted (metrics).

    Returns ``{kind: rows}`` for every kind of ``runner.retention.KINDS``. Raises
    SQLAlchemy's ``DBAPIError`` when the database fails (what went before is committed).
    """
    pacing = resolved(pacing, engine)
    run = _Run(engine, rules, db_now(engine) if now is None else now, dry_run, pacing, on_step)
    names = sorted(set(sql.flows_stored(engine)) | set(rules.flows or {}))
    if flow is not None:
        names = [n for n in names if n == flow]
    for name in names:
        for status, cutoff in rules.cutoffs(name, run.now).items():
            _instances(run, name, status, cutoff)
    _history(run, names)
    if flow is None:
        _log_bound(run)
        _events(run)
        if not run.pacing.stopped():
            cutoff = run.now - rules.workers
            run.wrote(lambda: sql.delete_workers(engine, cutoff, dry_run=dry_run), "workers")
    _versions(run, flow)
    return {k: run.counts.get(k, 0) for k in KINDS}


def _instances(run: _Run, flow: str, status: str, cutoff: float) -> None:
    after, per = 0, 1.0
    while not run.pacing.stopped():
        n = max(1, min(run.batch, int(run.batch / per)))
        rows = prune_instances.candidates(run.engine, flow, status, cutoff, after, n)
        if not rows:
            return
        after = rows[-1][0]
        ids = [r[0] for r in rows]
        before = sum(run.counts[k] for k in ("instances", "attempts", "commands"))
        run.wrote(
            partial(
                prune_instances.delete_instances,
                run.engine,
                ids,
                status,
                cutoff,
                dry_run=run.dry_run,
            )
        )
        rows_written = sum(run.counts[k] for k in ("instances", "attempts", "commands")) - before
        per = max(1.0, rows_written / len(ids))
        if run.dry_run:
            run.gone_events.update(r[1] for r in rows if r[1] is not None)
            run.gone_versions.update(r[2] for r in rows)


def _log_bound(run: _Run) -> None:
    """Past ``log_store_max``: delete the oldest terminal instances' logs first."""
    bound = run.rules.log_store_max
    if bound is None:
        return
    over = sql.log_bytes(run.engine) - bound
    while over > 0 and not run.pacing.stopped():
        before = run.counts["logs"]
        run.wrote(partial(sql.evict_logs, run.engine, over, dry_run=run.dry_run), "logs")
        if run.counts["logs"] == before or run.dry_run:
            return  # nothing evictable left (the rest belongs to live instances)
        over = sql.log_bytes(run.engine) - bound


def _history(run: _Run, names: list[str]) -> None:
    """Cut the attempts of live instances older than their flow's window."""
    newest = run.rules.newest_history_cutoff(names, run.now)
    if newest is None:
        return
    wanted = set(names)
    cuts = {n: run.rules.history_cutoff(n, run.now) for n in names}
    for rows in run.pages(lambda after: sql.attempts_after(run.engine, after, READ_ROWS)):
        picks = [
            r
            for r in rows
            if r[6] in wanted
            and cut_attempt(
                finished_at=r[3], attempt=r[2], last_attempt=r[8], status=r[7], cutoff=cuts[r[6]]
            )
        ]
        run.in_batches(picks, lambda c: sql.cut_history(run.engine, c, dry_run=run.dry_run))
        if all(r[3] is not None and r[3] >= newest for r in rows):
            return  # attempt ids follow time: nothing further is old enough


def _events(run: _Run) -> None:
    """Delete the events handled before the cutoff whose instances are all gone."""
    cutoff = run.rules.event_cutoff(run.now)
    if cutoff is None:
        return
    for rows in run.pages(lambda after: sql.events_after(run.engine, after, READ_ROWS)):
        old = [r[0] for r in rows if r[2] is not None and r[2] < cutoff]
        refs = sql.event_refs(run.engine, old)
        free = [e for e in old if refs[e] - run.gone_events[e] <= 0]
        run.in_batches(
            free, lambda c: sql.delete_events(run.engine, c, cutoff, dry_run=run.dry_run), "events"
        )
        if any(r[1] >= cutoff for r in rows):
            return  # created after the cutoff: handled after it too, and so are the next


def _versions(run: _Run, flow: str | None) -> None:
    """Delete the versions no instance is on, except each flow's current ones."""
    if run.pacing.stopped():
        return
    stored = sql.versions(run.engine, count=run.dry_run)
    newest: dict[str, tuple[float, str]] = {}
    for version, name, loaded, _n in stored:
        newest[name] = max(newest.get(name, (loaded, version)), (loaded, version))
    keep = set(run.rules.current) | {v for _at, v in newest.values()}
    names = [
        version
        for version, name, _loaded, n in stored
        if version not in keep
        and n - run.gone_versions[version] <= 0
        and (flow is None or name == flow)
    ]
    run.in_batches(
        names, lambda c: sql.delete_versions(run.engine, c, dry_run=run.dry_run), "versions"
    )


def text(counts: Mapping[str, int], *, dry_run: bool) -> str:
    """One line: ``pruned 12 instances, 40 attempts, ...`` (``would prune`` when dry)."""
    head = "would prune" if dry_run else "pruned"
    return f"{head} " + ", ".join(f"{counts.get(k, 0)} {k}" for k in KINDS)
