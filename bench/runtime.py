"""Make-room latency with 64 resident engines: the victim choice and its durable record.

Run: ``python3 dev.py run python bench/runtime.py [--rounds R] [--decisions N] [--quick]``.

What the pool does when an engine needs room (:meth:`hostler.runtime.pool.Pool._make_room`),
timed in three candidates that run side by side in every round, in alternating order:

- **decide**: the pure choice alone — :func:`hostler.policies.pool.plan_make_room` over 64
  residents (demand in the last minute, age, bytes), with the decision record it returns;
- **decide + write**: what the pool does before it stops anything — fold the ledger
  (``HostLedger.limits()``: a read of what other daemons wrote), the combined shortfall (CB5),
  the choice, and the durable append of ``pool.room_planned`` (one fsync'd commit);
- **write only** (the baseline): the same durable append of the same event, precomputed, and
  nothing else — the floor for any make-room that records its decision before acting.

Reported: p50 and p99 per candidate (medians over rounds of each round's percentile), and the
median of the per-round ratios *decide + write / write only* — what deciding adds to recording.
Raw samples go to ``bench/out/runtime.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.ledger import shortfall
from hostler.capacity.origin import API_SOURCE
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.events.pool import POOL_STREAM, PoolRoomPlanned
from hostler.policies.pool import PoolEntry, plan_make_room
from hostler.store.log import EventStore

GIB = 2**30
MIB = 2**20
RESIDENTS = 64


def residents(rng: random.Random, now: float) -> list[PoolEntry]:
    """64 engines of 64–512 MiB, a quarter busy, with up to 20 hits in the last two minutes."""
    found = []
    for i in range(RESIDENTS):
        hits = tuple(sorted(now - rng.uniform(0, 120) for _ in range(rng.randrange(21))))
        found.append(
            PoolEntry(
                f"llamacpp:m{i}:0",
                rng.randrange(64, 513) * MIB,
                now - rng.uniform(0, 3600),
                hits,
                busy=rng.random() < 0.25,
            )
        )
    return found


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 40: a smoke run")
    args = parser.parse_args()
    rounds, count = (2, 40) if args.quick else (args.rounds, args.decisions)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp, EventStore.open(Path(tmp) / "events.db") as store:
        ledger = HostLedger(
            store, OwnerIdentity.current("bench"), lambda: compute_budget(HostMemory(64 * GIB))
        )
        now = time.time()
        entries = residents(rng, now)
        # room for the 64 and 1 GiB more: a 2 GiB engine is 1 GiB short
        ledger.set_budget(sum(e.bytes for e in entries) + GIB, source=API_SOURCE)
        ledger.set_spillover(True)
        for entry in entries:  # the 64 residents hold their bytes in the ledger
            assert ledger.reserve(entry.key, entry.bytes).granted
        wanted = 2 * GIB

        def decide() -> PoolRoomPlanned:
            room = plan_make_room(entries, GIB, now)
            return PoolRoomPlanned(
                now,
                "llamacpp:new:0",
                wanted,
                GIB,
                list(room.evict),
                room.drain,
                room.reachable,
                room.decision,
            )

        def decide_and_write() -> None:
            limits = ledger.limits()
            state = ledger.state
            short = shortfall(limits, state.committed, wanted)
            room = plan_make_room(entries, short, now)
            event = PoolRoomPlanned(
                now,
                "llamacpp:new:0",
                wanted,
                short,
                list(room.evict),
                room.drain,
                room.reachable,
                room.decision,
            )
            store.append(POOL_STREAM, [event], expected_version=None)

        ready = decide()

        def write_only() -> None:
            store.append(POOL_STREAM, [ready], expected_version=None)

        candidates: dict[str, Callable[[], object]] = {
            "decide": decide,
            "decide + write": decide_and_write,
            "write only": write_only,
        }
        samples: dict[str, list[list[float]]] = {name: [] for name in candidates}
        order = list(candidates)
        for round_no in range(rounds):
            for name in order if round_no % 2 == 0 else list(reversed(order)):
                run = candidates[name]
                times = []
                for _ in range(count):
                    start = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - start)
                samples[name].append(times)
    report = {}
    for name, per_round in samples.items():
        report[name] = {
            "p50_ms": statistics.median(percentile(r, 0.5) for r in per_round) * 1000,
            "p99_ms": statistics.median(percentile(r, 0.99) for r in per_round) * 1000,
        }
    ratios = [
        statistics.median(both) / statistics.median(write)
        for both, write in zip(samples["decide + write"], samples["write only"], strict=True)
    ]
    print(f"make-room with {RESIDENTS} residents; {rounds} rounds of {count} decisions")
    print(f"{'candidate':<16} {'p50 ms':>9} {'p99 ms':>9}")
    for name, row in report.items():
        print(f"{name:<16} {row['p50_ms']:>9.3f} {row['p99_ms']:>9.3f}")
    print(
        f"decide + write / write only: {statistics.median(ratios):.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "runtime.json").write_text(
        json.dumps({"report": report, "ratios": ratios, "samples": samples}, indent=1)
    )


if __name__ == "__main__":
    main()
