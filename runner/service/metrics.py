"""Prometheus metrics of one daemon: ``flowrun --daemon --metrics [HOST:]PORT``.

A custom collector (prometheus_client's "custom collectors" pattern) reads, at scrape
time, the counters the worker, the sensor hub, the rules and the supervisor keep anyway,
so the hot loop pays nothing for them. Only two things are gathered per attempt, by the
worker's ``attempts.on_finished`` hook: attempts by (flow, state, outcome) and the attempt
duration histogram, each a dictionary increment (:class:`AttemptTally`). Instance counts
by flow and status, and the event → handler start latency, are read from the database by
the scrape, at most every ``refresh`` seconds (a grouped count over an index, not a scan
per scrape). It is served by the daemon's one HTTP listener
(``runner.service.http_listener``), which webhooks share.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Engine, event, func, select

from runner.ops.pools import read_pools
from runner.retention import KINDS
from runner.store.db import reading
from runner.store.space import database_bytes
from runner.store.tables import attempts, events, instances

if TYPE_CHECKING:
    from runner.engine.worker import Worker
    from runner.handlers.attempt import AttemptResult
    from runner.sensors.hub import SensorHub
    from runner.service.pruner import Pruner
    from runner.service.supervisor import Supervisor
    from runner.store.rows import Claim

log = logging.getLogger("flowrun.metrics")

#: Attempt duration buckets, seconds (handlers run from milliseconds to hours).
DURATION_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 300, 1800, 3600)
#: Event → handler start latency buckets, seconds.
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)

#: Worker counters exported as ``flowrun_<name>_total``: (stats key, metric, help).
WORKER_COUNTERS = (
    ("claimed", "claims", "Instances claimed from the table."),
    ("chained", "chained_moves", "Moves continued without releasing the instance."),
    ("committed", "committed_attempts", "Finished attempts committed."),
    ("cancelled", "cancelled_attempts", "Attempts closed as cancelled."),
    ("lost_fence", "fenced_out_commits", "Attempt outcomes refused: instance taken away."),
    ("recovered", "lost_attempts", "Attempts of dead workers recorded as lost here."),
    ("handed", "pool_seats_handed", "Pool seats handed from an ended attempt to a standby."),
)


def _pool_families(pools: list[dict[str, Any]]) -> Iterator[Any]:
    """``flowrun_pool_slots``, ``flowrun_pool_in_use`` and ``flowrun_pool_waiting`` of
    ``pools`` (``runner.ops.pools.read_pools``), labelled by pool."""
    for key, name, doc in (
        ("slots", "flowrun_pool_slots", "Slots of the pool in force (every daemon)."),
        ("in_use", "flowrun_pool_in_use", "Slots held by attempts running under a lease."),
        ("waiting", "flowrun_pool_waiting", "Instances waiting for a slot of the pool."),
    ):
        fam = GaugeMetricFamily(name, doc, labels=["pool"])
        for p in pools:
            fam.add_metric([p["name"]], p[key])
        yield fam


class AttemptTally:
    """Per-attempt figures, gathered by the worker's ``on_finished(claim, result)`` hook
    (plain dict and list operations on the event loop, about 1 us; ``Counter`` is twice
    as slow) and read by the collector.

    ``rows`` maps ``(flow, state)`` to ``[outcome counts (dict), bucket counts...,
    seconds sum]``."""

    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS) -> None:
        self.buckets = buckets
        self.rows: dict[tuple[str, str], list[Any]] = {}

    def finished(self, claim: Claim, result: AttemptResult) -> None:
        """Count one finished attempt (``rows.Claim``, ``AttemptResult``)."""
        spent = time.time() - claim.started_at
        row = self.rows.get((claim.flow, claim.state))
        if row is None:
            row = self.rows[(claim.flow, claim.state)] = [{}] + [0.0] * (len(self.buckets) + 2)
        counts = row[0]
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
        row[1 + bisect.bisect_left(self.buckets, spent)] += 1
        row[-1] += spent

    def outcomes(self) -> dict[tuple[str, str, str], int]:
        """``(flow, state, outcome)`` -> finished attempts (a copy)."""
        return {
            (flow, state, outcome): n
            for (flow, state), row in list(self.rows.items())
            for outcome, n in list(row[0].items())
        }

    def durations(self) -> dict[tuple[str, str], list[float]]:
        """``(flow, state)`` -> bucket counts and the seconds sum (a copy)."""
        return {key: list(row[1:]) for key, row in list(self.rows.items())}


def counter(stats: Any, key: str) -> int:
    """A worker counter by name (``stats`` a dict or a dataclass)."""
    if isinstance(stats, dict):
        return int(stats.get(key, 0))
    return int(getattr(stats, key, 0))


#: a histogram row's label values
_Labels = TypeVar("_Labels", bound=tuple[str, ...])


def _histogram(
    name: str,
    doc: str,
    labels: list[str],
    rows: Mapping[_Labels, list[float]],
    buckets: tuple[float, ...],
) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for key, row in sorted(rows.items()):
        cumulative, out = 0.0, []
        for bound, n in zip((*buckets, float("inf")), row[:-1], strict=False):
            cumulative += n
            out.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
        fam.add_metric(list(key), out, row[-1])
    return fam


class DaemonCollector(Collector):
    """Everything ``/metrics`` shows, read at scrape time.

    Args:
        engine: the database (instance counts, latencies; database errors are counted by a
            SQLAlchemy ``handle_error`` listener installed here).
        worker: the ``Worker`` (``stats``, ``running``, ``config``, ``stopping``).
        tally: the :class:`AttemptTally` fed by the worker.
        hub: the ``SensorHub`` or ``None`` (``events_stored``, ``rules.actions``).
        supervisor: the ``Supervisor`` (part states and restarts) or ``None``.
        refresh: seconds a database read is reused.
    """

    def __init__(
        self,
        engine: Engine,
        worker: Worker,
        tally: AttemptTally,
        hub: SensorHub | None = None,
        supervisor: Supervisor | None = None,
        refresh: float = 5.0,
    ) -> None:
        self.engine, self.worker, self.tally = engine, worker, tally
        self.hub, self.supervisor, self.refresh = hub, supervisor, refresh
        self.db_errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._read_at = -1e9
        self._instances: list[tuple[str, str, int]] = []
        self._latency = [0.0] * (len(LATENCY_BUCKETS) + 2)
        self._latency_after = 0  # last attempts.id observed
        self._bytes = 0
        self._pools: list[dict[str, Any]] = []  # ``runner.ops.pools.read_pools``
        self.pruner: Pruner | None = None  # the daemon's, if any
        # a pool event, not an engine one: engine events would put a dispatch check on
        # every statement of the worker's hot path
        event.listen(engine.pool, "invalidate", self._on_invalidate)

    def close(self) -> None:
        """Remove the database error listener."""
        if event.contains(self.engine.pool, "invalidate", self._on_invalidate):
            event.remove(self.engine.pool, "invalidate", self._on_invalidate)

    def _on_invalidate(self, dbapi_conn: Any, record: Any, exc: BaseException | None) -> None:
        self.db_errors["disconnect"] += 1

    def _read_db(self) -> None:
        """Refresh instance counts and latencies when older than ``refresh`` seconds."""
        with self._lock:
            if time.monotonic() - self._read_at < self.refresh:
                return
            self._read_at = time.monotonic()
            try:
                with reading(self.engine) as conn:
                    counts = conn.execute(
                        select(instances.c.flow, instances.c.status, func.count()).group_by(
                            instances.c.flow, instances.c.status
                        )
                    ).all()
                    lat = conn.execute(
                        select(attempts.c.id, attempts.c.started_at - events.c.created_at)
                        .join(instances, instances.c.id == attempts.c.instance_id)
                        .join(events, events.c.id == instances.c.event_id)
                        .where(
                            attempts.c.id > self._latency_after,
                            attempts.c.attempt == 1,
                            attempts.c.worker == self.worker.config.worker_id,
                        )
                        .order_by(attempts.c.id)
                        .limit(10_000)
                    ).all()
                self._bytes = database_bytes(self.engine)
                self._pools = read_pools(self.engine)
            except Exception as exc:  # noqa: BLE001 - a scrape during an outage shows old figures
                log.debug("metrics: database read failed: %s", exc)
                return
            self._instances = [(f, s, int(n)) for f, s, n in counts]
            for aid, seconds in lat:
                self._latency_after = max(self._latency_after, aid)
                seconds = max(0.0, float(seconds))
                self._latency[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
                self._latency[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family (called by prometheus_client on each scrape)."""
        self._read_db()
        w = self.worker
        for key, name, doc in WORKER_COUNTERS:
            yield CounterMetricFamily(f"flowrun_{name}", doc, value=counter(w.stats, key))
        fam = CounterMetricFamily(
            "flowrun_attempts", "Finished attempts.", labels=["flow", "state", "outcome"]
        )
        for labels, n in sorted(self.tally.outcomes().items()):
            fam.add_metric(list(labels), n)
        yield fam
        yield _histogram(
            "flowrun_attempt_duration_seconds",
            "Attempt run time, claim to end.",
            ["flow", "state"],
            self.tally.durations(),
            self.tally.buckets,
        )
        running = len(w.running)
        yield GaugeMetricFamily("flowrun_running_attempts", "Attempts running now.", running)
        free = 0 if w.stopping else max(0, w.config.concurrency - running)
        yield GaugeMetricFamily("flowrun_free_slots", "Attempts this worker could start.", free)
        gauge = GaugeMetricFamily(
            "flowrun_instances", "Instances by flow and status.", labels=["flow", "status"]
        )
        for f, s, n in self._instances:
            gauge.add_metric([f, s], n)
        yield gauge
        yield _histogram(
            "flowrun_event_start_latency_seconds",
            "Sensor event stored to first attempt started, for attempts of this worker.",
            [],
            {(): list(self._latency)},
            LATENCY_BUCKETS,
        )
        yield CounterMetricFamily(
            "flowrun_database_disconnects",
            "Database connections found broken and dropped (outages).",
            value=self.db_errors["disconnect"],
        )
        yield GaugeMetricFamily(
            "flowrun_database_bytes", "Size of the database (SQLite: without its WAL).", self._bytes
        )
        yield from _pool_families(self._pools)
        if self.pruner is not None:
            fam = CounterMetricFamily(
                "flowrun_pruned_rows", "Rows deleted by this daemon's pruner.", labels=["kind"]
            )
            pruned = self.pruner.pruned.copy()
            for kind in KINDS:
                fam.add_metric([kind], pruned.get(kind, 0))
            yield fam
        if self.hub is not None:
            fam = CounterMetricFamily(
                "flowrun_sensor_events", "Events stored by sensors here.", labels=["sensor"]
            )
            for name, n in sorted(self.hub.events_stored.copy().items()):
                fam.add_metric([name], n)
            yield fam
            fam = CounterMetricFamily(
                "flowrun_rule_actions", "Rule actions taken here.", labels=["sensor"]
            )
            for name, n in sorted(self.hub.rules.actions.copy().items()):
                fam.add_metric([name], n)
            yield fam
        if self.supervisor is not None:
            up = GaugeMetricFamily("flowrun_part_up", "1 while a part runs.", labels=["part"])
            restarts = CounterMetricFamily(
                "flowrun_part_restarts", "Restarts of a daemon part.", labels=["part"]
            )
            faults = CounterMetricFamily(
                "flowrun_database_errors",
                "Expected faults (database or file-system errors) that stopped a part.",
                labels=["part"],
            )
            for name, part in sorted(self.supervisor.parts.copy().items()):
                up.add_metric([name], 1 if part.state == "running" else 0)
                restarts.add_metric([name], part.restarts)
                faults.add_metric([name], part.expected_failures)
            yield up
            yield restarts
            yield faults


def registry_for(collector: DaemonCollector) -> CollectorRegistry:
    """A fresh registry holding only ``collector`` (no process/platform collectors, so two
    daemons in one test process do not clash)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def metrics_app(
    engine: Engine,
    worker: Worker,
    tally: AttemptTally,
    supervisor: Supervisor,
) -> tuple[DaemonCollector, Callable[..., Any]]:
    """A daemon's ``--metrics``: its collector (no hub yet: the daemon sets ``hub`` and
    ``pruner`` once they start) and the WSGI application serving it, for the daemon's
    listener (``runner.service.http_listener``)."""
    collector = DaemonCollector(engine, worker, tally, None, supervisor)
    return collector, make_wsgi_app(registry_for(collector))
