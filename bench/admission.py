"""Decision latency: admission (ledger policy) + victim selection with 64 resident engines.

Measured two ways, side by side in each round (their order alternating between rounds):

* *policy only*: ``decide_reserve`` on an in-memory ledger state, plus victim selection when
  denied — the pure decision;
* *with the ledger write*: ``HostLedger.reserve`` on a real SQLite ledger file (WAL,
  ``synchronous=FULL``), which is what every real admission does: one write transaction that
  catches up the ledger stream, decides, and records the decision (granted or denied) durably
  — plus the same victim selection when denied.

Run: ``python3 dev.py run python bench/admission.py``. Prints p50 / p99 / max in microseconds
(medians of the rounds) and writes ``bench/out/admission.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from hostler import EventStore
from hostler.capacity.budget import CapacityBudget, HostMemory, compute_budget
from hostler.capacity.ledger import decide_reserve, limits_of, shortfall, state_from
from hostler.capacity.units import GIB, MIB
from hostler.capacity.victims import Resident, choose_victims
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.events.ledger import LEDGER_STREAM, LedgerReserved

OUT = Path(__file__).parent / "out"
OWNER = "d"


def percentiles(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "p50_us": samples[len(samples) // 2],
        "p99_us": samples[int(len(samples) * 0.99)],
        "max_us": samples[-1],
    }


def policy_only(
    seeded: list[LedgerReserved],
    residents: list[Resident],
    budget: CapacityBudget,
    wants: list[int],
) -> dict[str, float]:
    state = state_from(seeded)
    samples: list[float] = []
    for wanted in wants:
        started = time.perf_counter_ns()
        decision = decide_reserve(state, budget, "llamacpp:new:0", wanted, OWNER)
        if not decision.granted:
            limits = limits_of(state, budget)
            choose_victims(residents, shortfall(limits, state.committed, wanted))
        samples.append((time.perf_counter_ns() - started) / 1000)
    return percentiles(samples)


def with_ledger_write(
    tmp: Path,
    seeded: list[LedgerReserved],
    residents: list[Resident],
    budget: CapacityBudget,
    wants: list[int],
) -> dict[str, float]:
    path = tmp / f"ledger-{time.perf_counter_ns()}.db"
    with EventStore.open(path) as store:
        store.append(LEDGER_STREAM, seeded, expected_version=0)
        owner = OwnerIdentity(pid=1, create_time=0.0, boot="bench", label=OWNER)
        ledger = HostLedger(store, owner, lambda: budget, alive=lambda _owner: True)
        ledger.refresh()
        samples: list[float] = []
        for wanted in wants:
            started = time.perf_counter_ns()
            decision = ledger.reserve("llamacpp:new:0", wanted)
            if not decision.granted:
                limits = limits_of(ledger.state, budget)
                choose_victims(residents, shortfall(limits, ledger.state.committed, wanted))
            samples.append((time.perf_counter_ns() - started) / 1000)
    for leftover in tmp.glob(f"{path.name}*"):
        leftover.unlink()
    return percentiles(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engines", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=20_000, help="policy-only, per round")
    parser.add_argument(
        "--ledger-decisions", type=int, default=4_000, help="with the ledger write, per round"
    )
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    budget = compute_budget(HostMemory(system_ram=512 * GIB, vram=80 * GIB))
    tmp = Path(tempfile.mkdtemp(prefix="hostler-bench-admission-"))
    rounds: dict[str, list[dict[str, float]]] = {"policy only": [], "with ledger write": []}
    try:
        for r in range(args.rounds):
            sizes = [rng.randrange(256 * MIB, 6 * GIB) for _ in range(args.engines)]
            seeded = [
                LedgerReserved(f"llamacpp:m{i}:0", size, OWNER, 0, 0, 0, 0, True)
                for i, size in enumerate(sizes)
            ]
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
            wants = [rng.randrange(512 * MIB, 40 * GIB) for _ in range(args.decisions)]
            runs = [
                ("policy only", partial(policy_only, seeded, residents, budget, wants)),
                (
                    "with ledger write",
                    partial(
                        with_ledger_write,
                        tmp,
                        seeded,
                        residents,
                        budget,
                        wants[: args.ledger_decisions],
                    ),
                ),
            ]
            for name, run in runs if r % 2 == 0 else runs[::-1]:
                rounds[name].append(run())
                print(f"round {r + 1}: {name}: {rounds[name][-1]}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    medians = {
        name: {k: statistics.median(x[k] for x in by) for k in by[0]} for name, by in rounds.items()
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "admission.json").write_text(
        json.dumps({"medians": medians, "rounds": rounds, "params": vars(args)}, indent=2)
    )
    print(
        f"admission + victim selection, {args.engines} resident engines, {args.rounds} rounds "
        f"({args.decisions} policy-only decisions, {args.ledger_decisions} with the ledger write)"
    )
    print("| decision | p50 | p99 | max |")
    print("|---|---:|---:|---:|")
    for name, m in medians.items():
        print(f"| {name} | {m['p50_us']:.1f} µs | {m['p99_us']:.1f} µs | {m['max_us']:.1f} µs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
