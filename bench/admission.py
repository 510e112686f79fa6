"""Decision latency: admission (ledger policy) + victim selection with 64 resident engines.

Run: ``python3 dev.py run python bench/admission.py``. Prints p50 / p99 / max in microseconds
over many decisions against randomly sized ledgers, and writes ``bench/out/admission.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.events import LedgerReserved
from hostler.capacity.ledger import decide_reserve, limits_of, shortfall, state_from
from hostler.capacity.units import GIB, MIB
from hostler.capacity.victims import Resident, choose_victims

OUT = Path(__file__).parent / "out"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    budget = compute_budget(HostMemory(system_ram=512 * GIB, vram=80 * GIB))
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        sizes = [rng.randrange(256 * MIB, 6 * GIB) for _ in range(args.engines)]
        state = state_from(
            LedgerReserved(f"llamacpp:m{i}:0", size, "d", 0, 0, 0, 0, True)
            for i, size in enumerate(sizes)
        )
        residents = [
            Resident(
                f"llamacpp:m{i}:0",
                size,
                busy=rng.random() < 0.3,
                draining=False,
                recent_hits=rng.randrange(0, 20),
                last_used_at=rng.uniform(0, 1000),
            )
            for i, size in enumerate(sizes)
        ]
        samples: list[float] = []
        for n in range(args.decisions):
            wanted = rng.randrange(512 * MIB, 40 * GIB)
            started = time.perf_counter_ns()
            decision = decide_reserve(state, budget, f"llamacpp:new{n}:0", wanted, "d")
            if not decision.granted:
                limits = limits_of(state, budget)
                choose_victims(residents, shortfall(limits, state.committed, wanted))
            samples.append((time.perf_counter_ns() - started) / 1000)
        samples.sort()
        rounds.append(
            {
                "p50_us": samples[len(samples) // 2],
                "p99_us": samples[int(len(samples) * 0.99)],
                "max_us": samples[-1],
            }
        )
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    OUT.mkdir(exist_ok=True)
    (OUT / "admission.json").write_text(
        json.dumps({"medians": medians, "rounds": rounds}, indent=2)
    )
    print(
        f"admission + victim selection, {args.engines} resident engines, {args.decisions} decisions x {args.rounds} rounds"
    )
    print(
        f"p50 {medians['p50_us']:.1f} us   p99 {medians['p99_us']:.1f} us   max {medians['max_us']:.1f} us (medians of rounds)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
