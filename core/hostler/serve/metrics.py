"""``/metrics`` in Prometheus's text format, derived from the runtime and from the event log.

Gauges come from the runtime's snapshot at scrape time (resident engines, bytes reserved and
measured, queue depth); counters from the log's own events, folded incrementally (evictions and
other stops by reason, crashes, starts, queue waits, lease waits). What a dashboard shows is
therefore what ``hostler events`` explains.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hostler.errors import StoreError
from hostler.events.pool import PoolDrainEnded
from hostler.events.queue import QueueDispatched
from hostler.machines.engine import EngineCrashed, EngineStartRequested, EngineStopRequested
from hostler.machines.lease import LeaseGranted, LeaseRequested
from hostler.runtime.facade import Runtime, RuntimeStatus
from hostler.runtime.queue import QueueSummary
from hostler.store.log import EventStore

__all__ = ["Metrics"]

_COUNTED = (
    "engine.stop_requested",
    "engine.crashed",
    "engine.start_requested",
    "queue.dispatched",
    "lease.requested",
    "lease.granted",
    "pool.drain_ended",
)


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


class Metrics:
    """Renders ``/metrics`` for one runtime and its log."""

    def __init__(self, runtime: Runtime, store: EventStore) -> None:
        self.runtime = runtime
        self.store = store
        self._seq = 0
        self._stops: Counter[str] = Counter()
        self._crashes: Counter[str] = Counter()
        self._starts: Counter[str] = Counter()
        self._drains: Counter[str] = Counter()
        self._queue_wait = 0.0
        self._dispatched = 0
        self._leases = 0
        self._lease_wait = 0.0
        self._lease_asked: dict[str, float] = {}  # lease stream → when it was requested
        self._lock = anyio.Lock()

    async def render(self) -> bytes:
        """The exposition text (the log is folded off the event loop)."""
        status, queues = self.runtime.status(), self.runtime.queues()
        details = await self.runtime.report.engine_details()
        async with self._lock:
            return await anyio.to_thread.run_sync(self._render, status, queues, details)

    def _fold(self) -> None:
        """Count what the log recorded since the last scrape (its events as decoded, typed)."""
        for record in self.store.read_all(after_seq=self._seq, types=_COUNTED):
            event = record.event
            if isinstance(event, EngineStopRequested):
                self._stops[str(event.reason)] += 1
            elif isinstance(event, EngineCrashed):
                self._crashes[record.stream_id.removeprefix("engine/")] += 1
            elif isinstance(event, EngineStartRequested):
                self._starts[str(event.cause)] += 1
            elif isinstance(event, QueueDispatched):
                self._dispatched += 1
                self._queue_wait += event.waited
            elif isinstance(event, LeaseRequested):
                self._lease_asked[record.stream_id] = event.at
            elif isinstance(event, LeaseGranted):
                self._leases += 1
                asked = self._lease_asked.pop(record.stream_id, None)
                if asked is not None:
                    self._lease_wait += max(0.0, event.at - asked)
            elif isinstance(event, PoolDrainEnded):
                self._drains[event.outcome] += 1
            self._seq = max(self._seq, record.seq)

    def _render(
        self,
        status: RuntimeStatus,
        queues: dict[str, QueueSummary],
        details: dict[str, dict[str, Any]],
    ) -> bytes:
        writable = 1.0
        try:
            self._fold()
        except StoreError:  # the log is away: the counts so far, and say so
            writable = 0.0
        families: list[Metric] = []
        log_up = GaugeMetricFamily(
            "hostler_log_up", "1 while the event log answers, 0 while it is away"
        )
        log_up.add_metric([], writable)
        families.append(log_up)
        up = GaugeMetricFamily(
            "hostler_engine_up", "1 while the engine runs", labels=["engine", "state"]
        )
        held = GaugeMetricFamily(
            "hostler_engine_reserved_bytes",
            "bytes the ledger holds for the engine (measured once measured)",
            labels=["engine"],
        )
        measured = GaugeMetricFamily(
            "hostler_engine_measured_bytes",
            "the engine's measured footprint once ready (beside what was reserved)",
            labels=["engine"],
        )
        for key, facts in sorted(details.items()):
            if isinstance(facts.get("measured_bytes"), int):
                measured.add_metric([key], float(facts["measured_bytes"]))
        busy = GaugeMetricFamily("hostler_engine_busy", "1 while it serves", labels=["engine"])
        for view in status.engines:
            up.add_metric([view.key, view.state], 1.0 if view.state == "running" else 0.0)
            held.add_metric([view.key], float(view.bytes))
            busy.add_metric([view.key], 1.0 if view.busy else 0.0)
        families += [up, held, busy]
        committed = GaugeMetricFamily(
            "hostler_ledger_committed_bytes", "bytes every reservation holds (all daemons)"
        )
        committed.add_metric([], float((status.ledger or {}).get("committed") or 0))
        families.append(committed)
        running = GaugeMetricFamily("hostler_queue_running", "requests running", labels=["engine"])
        waiting = GaugeMetricFamily(
            "hostler_queue_waiting", "requests waiting", labels=["engine", "lane"]
        )
        width = GaugeMetricFamily("hostler_queue_width", "the live width", labels=["engine"])
        for key, summary in queues.items():
            running.add_metric([key], float(summary.running))
            lanes = Counter(item.lane for item in summary.pending)
            for lane in ("interactive", "background"):
                waiting.add_metric([key, lane], float(lanes.get(lane, 0)))
            width.add_metric([key], float(summary.width))
        families += [running, waiting, width]
        stops = CounterMetricFamily(
            "hostler_engine_stops", "engine stops by reason (evicted, idle...)", labels=["reason"]
        )
        for reason, count in sorted(self._stops.items()):
            stops.add_metric([reason], float(count))
        crashes = CounterMetricFamily("hostler_engine_crashes", "crashes", labels=["engine"])
        for engine, count in sorted(self._crashes.items()):
            crashes.add_metric([engine], float(count))
        starts = CounterMetricFamily("hostler_engine_starts", "starts by cause", labels=["cause"])
        for cause, count in sorted(self._starts.items()):
            starts.add_metric([cause], float(count))
        drains = CounterMetricFamily("hostler_drains", "drains by outcome", labels=["outcome"])
        for outcome, count in sorted(self._drains.items()):
            drains.add_metric([outcome], float(count))
        dispatched = CounterMetricFamily("hostler_queue_dispatched", "requests dispatched")
        dispatched.add_metric([], float(self._dispatched))
        waited = CounterMetricFamily(
            "hostler_queue_wait_seconds", "seconds requests waited in queues, summed"
        )
        waited.add_metric([], self._queue_wait)
        leases = CounterMetricFamily("hostler_leases_granted", "GPU leases granted")
        leases.add_metric([], float(self._leases))
        lease_wait = CounterMetricFamily(
            "hostler_lease_wait_seconds", "seconds GPU lease requests waited to be granted, summed"
        )
        lease_wait.add_metric([], self._lease_wait)
        families += [measured, stops, crashes, starts, drains, dispatched, waited, leases]
        families.append(lease_wait)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(families))
        return generate_latest(registry)
