"""What-if benchmark: how many recorded requests a what-if replays per second (PM22).

Builds a log of recorded requests the way the runtime writes them (each request's
``queue.enqueued``, ``queue.dispatched`` and ``queue.released``; each engine start's ledger
reservation, measurement and ``engine.start_requested``/``engine.ready``; each eviction's
``engine.stop_requested``/``engine.stopped``) over six models of which three fit the
budget: 40 conversations each staying with one model, one-shot calls (a fifth) to any,
skewed popularity (weights 1/n^1.5), a background lane, and bursts that queue. Then it
times, each as the median of several rounds:

* reading the workload out of the log (:func:`hostler.postmortem.workload.workload_from`,
  the rows already read);
* the what-if itself (:func:`hostler.postmortem.whatif.simulate`) under a budget that fits
  two models (more evictions than recorded), in requests per second.

Target (issue 11): at least 20,000 requests/s over 100,000 recorded requests.

Run: ``uv run python bench/replay_whatif.py`` (``--requests N``, ``--rounds R``, ``--quick``).
Results are printed as a markdown table and written to ``bench/out/replay_whatif.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hostler import EventStore
from hostler.events.base import Event
from hostler.events.ledger import LedgerMeasured, LedgerReserved
from hostler.events.pool import PoolRoomPlanned
from hostler.events.queue import QueueDispatched, QueueEnqueued, QueueReleased
from hostler.machines.engine import (
    EngineReady,
    EngineStartRequested,
    EngineStopped,
    EngineStopRequested,
)
from hostler.postmortem.whatif import simulate
from hostler.postmortem.workload import Settings, workload_from

OUT = Path(__file__).parent / "out"
GIB = 2**30
MODELS = [f"llamacpp:m{i}:0" for i in range(6)]
SIZE = 4 * GIB
BUDGET = 3 * SIZE  # what the log was recorded under: three fit
EPOCH = 1_700_000_000.0  # the engines' clock; the queue's reads 0 then


COLD_START = 1.5


def _evict(emit: Any, victim: str, key: str, at: float) -> None:
    """The events of one eviction: the room planned, the victim's stop asked and done."""
    decision = {"eviction": "lru"}
    emit("pool/host", PoolRoomPlanned(EPOCH + at, key, SIZE, SIZE, [victim], None, True, decision))
    emit(
        f"engine/{victim}",
        EngineStopRequested("running", "stopping", EPOCH + at, "evicted", {}),
    )
    emit(f"engine/{victim}", EngineStopped("stopping", "stopped", EPOCH + at, 0, None))


def _start(emit: Any, key: str, at: float) -> None:
    """The events of one start: reserved, asked, ready after the cold start, measured."""
    emit("ledger/host", LedgerReserved(key, SIZE, "me", 0, 0, BUDGET, BUDGET, True))
    emit(f"engine/{key}", EngineStartRequested("stopped", "starting", EPOCH + at, "request"))
    emit(f"engine/{key}", EngineReady("starting", "running", EPOCH + at + COLD_START))
    emit("ledger/host", LedgerMeasured(key, SIZE, "me", SIZE))


def build_log(path: Path, requests: int, seed: int = 7) -> int:
    """Write a log of ``requests`` recorded requests (LRU, drain the first to end); its rows."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.5 for i in range(len(MODELS))]
    sessions = [(f"s{n}", rng.choices(MODELS, weights)[0]) for n in range(40)]
    resident: list[str] = []  # least recently used first
    now = 0.0
    batches: dict[str, list[Event]] = {}
    stamp = {"at": EPOCH}

    def emit(stream: str, event: Event) -> None:
        batches.setdefault(stream, []).append(event)

    with EventStore.open(
        path, synchronous="OFF", clock=lambda: datetime.fromtimestamp(stamp["at"], UTC)
    ) as store:

        def flush() -> None:
            for stream, events in batches.items():
                store.append(stream, events, expected_version=None)
            batches.clear()

        busy_until = {key: 0.0 for key in MODELS}
        latest = 0.0
        for ident in range(1, requests + 1):
            now += rng.expovariate(1.0)  # about one a second, in bursts
            session, key = rng.choice(sessions)  # a conversation stays with its model
            if rng.random() < 0.2:  # a one-shot call to any model
                session, key = f"one-{ident}", rng.choices(MODELS, weights)[0]
            lane = "background" if rng.random() < 0.1 else "interactive"
            emit(f"queue/{key}", QueueEnqueued(key, ident, lane, False, session, None, None, now))
            start = max(now, busy_until[key])
            paid = 0.0
            if key not in resident:
                if len(resident) == 3:  # room from the least recently used idle engine, or
                    idle = [k for k in resident if busy_until[k] <= start]  # drain the first
                    victim = idle[0] if idle else min(resident, key=lambda k: busy_until[k])
                    start = max(start, busy_until[victim])
                    resident.remove(victim)
                    _evict(emit, victim, key, start)
                _start(emit, key, start)
                paid = COLD_START
            else:
                resident.remove(key)
            resident.append(key)
            work = rng.uniform(0.05, 1.0)
            decision = {"rule": "oldest", "interactive_cap": 1}
            begun = max(now, busy_until[key])  # its queue's slot: when its engine's last ended
            emit(f"queue/{key}", QueueDispatched(key, ident, lane, begun - now, begun, decision))
            end = start + paid + work
            emit(f"queue/{key}", QueueReleased(key, ident, lane, end - begun, end))
            busy_until[key] = end
            latest = max(latest, end)
            if ident % 5000 == 0:  # written just after its last event, as the runtime does
                stamp["at"] = EPOCH + latest + 0.01
                flush()
        stamp["at"] = EPOCH + latest + 0.01
        flush()
        return store.count()


def timed(func: Any, rounds: int) -> tuple[float, float, Any]:
    """Median wall-clock and CPU seconds of ``rounds`` calls, and the last result."""
    wall, cpu = [], []
    result = None
    for _ in range(rounds):
        began, began_cpu = time.perf_counter(), time.process_time()
        result = func()
        wall.append(time.perf_counter() - began)
        cpu.append(time.process_time() - began_cpu)
    return statistics.median(wall), statistics.median(cpu), result


def main() -> None:
    """Build the log, time the extraction and the what-if, print and save the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10,000 requests, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 10_000, 3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.db"
        began = time.perf_counter()
        rows_written = build_log(path, args.requests)
        built = time.perf_counter() - began
        with EventStore.open(path) as store:
            began = time.perf_counter()
            rows = list(store.read_all())
            read = time.perf_counter() - began
    extract, _, workload = timed(lambda: workload_from(rows), args.rounds)
    assert len(workload.requests) == args.requests, len(workload.requests)
    settings = Settings(2 * SIZE, workload.settings.policy, workload.settings.spillover)
    replay, replay_cpu, figures = timed(lambda: simulate(workload, settings), args.rounds)
    recorded, recorded_cpu, base = timed(lambda: simulate(workload, workload.settings), args.rounds)
    rate, rate_cpu = args.requests / replay, args.requests / replay_cpu
    result = {
        "requests": args.requests,
        "rows": rows_written,
        "rounds": args.rounds,
        "load_average": os.getloadavg()[0],
        "build_s": round(built, 2),
        "read_s": round(read, 2),
        "extract_s": round(extract, 3),
        "extract_rows_per_s": round(len(rows) / extract),
        "whatif_s": round(replay, 3),
        "whatif_cpu_s": round(replay_cpu, 3),
        "whatif_requests_per_s": round(rate),
        "whatif_requests_per_cpu_s": round(rate_cpu),
        "recorded_settings_s": round(recorded, 3),
        "recorded_settings_requests_per_s": round(args.requests / recorded),
        "recorded_settings_requests_per_cpu_s": round(args.requests / recorded_cpu),
        "evictions_recorded_settings": base.total.evictions,
        "evictions_whatif": figures.total.evictions,
        "target_requests_per_s": 20_000,
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "replay_whatif.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.rounds} rounds")
    print("| step | wall | rate (wall) | rate (CPU time) | target |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| workload from {len(rows):,} rows | {extract:.2f} s | {len(rows) / extract:,.0f} rows/s | | |"
    )
    mark = "✔" if rate >= 20_000 else "✘"
    print(
        f"| what-if, budget for 2 of 6 models ({figures.total.evictions:,} evictions) | "
        f"{replay:.2f} s | **{rate:,.0f} requests/s** | {rate_cpu:,.0f} requests/s | "
        f"≥ 20,000 requests/s {mark} |"
    )
    print(
        f"| replay, recorded budget (3 of 6; {base.total.evictions:,} evictions) | "
        f"{recorded:.2f} s | {args.requests / recorded:,.0f} requests/s | "
        f"{args.requests / recorded_cpu:,.0f} requests/s | |"
    )


if __name__ == "__main__":
    main()
