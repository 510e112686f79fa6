"""Post-mortem benchmark: ``hostler state --at`` on a 1,000,000-event log, cold and warm.

Generates a realistic log (default 1,000,000 events) shaped like a busy day of the runtime:
40 models of which about six fit the budget, requests with their queue events (enqueued,
dispatched, released) and session bindings, a start for every model not resident (reserved,
start requested, spawned, bound, ready, measured), the eviction that made room for it (PP4
plan with every candidate's demand figures, drain, stop, exit, release), now and then a
crash (SIGKILL) and its restart, and GPU leases (requested, granted, released). The events
are the real registered classes, encoded as the store encodes them, inserted in bulk.

Then it runs ``hostler state --db LOG --at SEQ --json`` as a user runs it (a fresh Python
process each time) at several points of the log, and at one time, each the median of
``--runs`` runs; each figure is the whole run's wall time, and in brackets the command's own
work (``main`` alone, after the interpreter started and imported the ``hostler`` package; since
the CLI imports a command's module only when it runs, this includes importing ``state``'s
dependencies, the log store's SQLAlchemy among them). ``hostler --version``, which imports no
command, is timed too, as the floor every command pays:

* cold: the snapshot cache beside the log is deleted before each run (the first question
  ever asked of that log folds from its start and saves snapshots on its way);
* warm: the cache left by earlier runs (the fold resumes from the nearest snapshot);
* no snapshots (``--no-snapshots``): the whole prefix folded, nothing read or saved.

Run: ``uv run python bench/replay.py`` (``--events 100000 --runs 3`` for a smoke run). Results
are printed as a markdown table and written to ``bench/out/replay.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hostler import EventStore
from hostler.events import Event, encode
from hostler.events.ledger import LedgerBound, LedgerMeasured, LedgerReleased, LedgerReserved
from hostler.events.pool import PoolDrainEnded, PoolDrainStarted, PoolRoomPlanned
from hostler.events.queue import QueueDispatched, QueueEnqueued, QueueReleased
from hostler.events.router import SessionBound
from hostler.machines.engine import (
    EngineCrashed,
    EngineReady,
    EngineSpawned,
    EngineStartRequested,
    EngineStopped,
    EngineStopRequested,
)
from hostler.machines.lease import LeaseGranted, LeaseReleased, LeaseRequested
from hostler.postmortem.snapshots import SIDECAR_SUFFIX, SNAPSHOT_EVERY
from hostler.store.log import format_time

OUT = Path(__file__).parent / "out"
MIB = 2**20
MODELS = 40
BUDGET = 6 * 900 * MIB
OWNER = "bench:1:1.0:boot"
INSERT = (
    "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


class LogWriter:
    """Appends encoded events with their stream versions and a clock that moves 20 ms a row."""

    def __init__(self, path: Path) -> None:
        EventStore.open(path).close()  # creates and migrates the schema
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("BEGIN IMMEDIATE")
        self.versions: dict[str, int] = {}
        self.rows: list[tuple[Any, ...]] = []
        self.count = 0
        self.start = datetime(2026, 11, 1, tzinfo=UTC)
        self.at = self.start.timestamp()

    def add(self, stream: str, event: Event) -> None:
        version = self.versions.get(stream, 0) + 1
        self.versions[stream] = version
        type_name, schema_version, data = encode(event)
        stamp = format_time(self.start + timedelta(seconds=self.count * 0.02))
        self.rows.append(
            (
                stream,
                version,
                type_name,
                schema_version,
                json.dumps(data),
                '{"hostler_version":"bench"}',
                stamp,
            )
        )
        self.count += 1
        self.at += 0.02
        if len(self.rows) >= 50_000:
            self.flush()

    def flush(self) -> None:
        self.conn.executemany(INSERT, self.rows)
        self.rows.clear()

    def close(self) -> None:
        self.flush()
        self.conn.execute("COMMIT")
        self.conn.close()


class Scenario:
    """The runtime's event shapes, driven by a seeded random workload."""

    def __init__(self, log: LogWriter, seed: int = 11) -> None:
        self.log = log
        self.rng = random.Random(seed)
        self.resident: dict[str, dict[str, Any]] = {}
        self.state: dict[str, str] = {}
        self.request_ids: dict[str, int] = {}
        self.pids = 10_000
        self.leases = 0

    def key(self, m: int) -> str:
        return f"llamacpp:model{m}:0"

    def engine(self, key: str, event: Event) -> None:
        self.log.add(f"engine/{key}", event)
        self.state[key] = event.to_state  # type: ignore[attr-defined]

    def start(self, key: str) -> None:
        at = self.log.at
        size = self.rng.randint(700, 1100) * MIB
        committed = sum(r["bytes"] for r in self.resident.values())
        if committed + size > BUDGET:
            self.make_room(key, size, committed + size - BUDGET)
            committed = sum(r["bytes"] for r in self.resident.values())
        self.log.add(
            "ledger/host",
            LedgerReserved(key, size, OWNER, 0, committed, BUDGET, BUDGET, True, "tok"),
        )
        self.engine(
            key, EngineStartRequested(self.state.get(key, "stopped"), "starting", at, "request")
        )
        self.pids += 1
        port = 40_000 + self.pids % 20_000
        self.engine(
            key, EngineSpawned("starting", "starting", at, self.pids, at, "boot", "tok", "fp", port)
        )
        self.log.add("ledger/host", LedgerBound(key, OWNER, self.pids, at))
        self.engine(key, EngineReady("starting", "running", at + 2))
        measured = size - self.rng.randint(0, 60) * MIB
        self.log.add("ledger/host", LedgerMeasured(key, measured, OWNER, size))
        self.resident[key] = {"bytes": measured, "hits": [], "last": at}

    def make_room(self, for_key: str, wanted: int, shortfall: int) -> None:
        now = self.log.at
        candidates = []
        for key, r in sorted(self.resident.items()):
            ages = [round(now - t, 3) for t in r["hits"] if now - t < 60]
            candidates.append(
                {
                    "key": key,
                    "bytes": r["bytes"],
                    "recent_hits": len(ages),
                    "hit_ages": ages,
                    "idle_for": round(now - r["last"], 3),
                    "busy": False,
                    "draining": False,
                }
            )
        order = sorted(candidates, key=lambda c: (c["recent_hits"], -c["idle_for"], c["key"]))
        victims, freed = [], 0
        for c in order:
            if freed >= shortfall:
                break
            victims.append(c["key"])
            freed += c["bytes"]
        decision = {
            "policy": "pool",
            "version": 1,
            "rule": "PP4",
            "eviction": "demand-lru",
            "eviction_version": 1,
            "shortfall": shortfall,
            "now": now,
            "candidates": candidates,
            "evict": victims,
            "freed": freed,
            "drain": None,
            "reachable": True,
        }
        self.log.add(
            "pool/host",
            PoolRoomPlanned(now, for_key, wanted, shortfall, victims, None, True, decision),
        )
        drain = {"policy": "pool", "version": 1, "rule": "PP5", "busy": False, "waited": 0.0}
        for victim in victims:
            self.log.add("pool/host", PoolDrainStarted(now, victim, for_key, 30.0))
            why = {**decision, "for": for_key, "drain": drain}
            self.engine(victim, EngineStopRequested("running", "stopping", now, "evicted", why))
            self.engine(victim, EngineStopped("stopping", "stopped", now + 0.2, 0, None))
            gone = self.resident.pop(victim)
            self.log.add("ledger/host", LedgerReleased(victim, gone["bytes"], OWNER, "released"))
            self.log.add("pool/host", PoolDrainEnded(now, victim, "evicted", 0.0, drain))

    def request(self) -> None:
        m = min(int(self.rng.paretovariate(1.2)) - 1, MODELS - 1)
        key = self.key(m)
        if key not in self.resident:
            self.start(key)
        n = self.request_ids[key] = self.request_ids.get(key, 0) + 1
        session = f"s{self.rng.randint(1, 5000)}"
        if self.rng.random() < 0.1:
            self.log.add("router/host", SessionBound(self.log.at, session, key, "kept", {key: 1}))
        queue = f"queue/{key}"
        mono = self.log.at - 1.7e9
        self.log.add(queue, QueueEnqueued(key, n, "interactive", False, session, None, None, mono))
        decision = {"policy": "request-queue", "version": 1, "rule": "oldest", "id": n}
        self.log.add(queue, QueueDispatched(key, n, "interactive", 0.01, mono, decision))
        self.log.add(queue, QueueReleased(key, n, "interactive", 1.5, mono + 1.5))
        r = self.resident[key]
        r["hits"] = [*r["hits"][-20:], self.log.at]
        r["last"] = self.log.at

    def crash(self) -> None:
        if not self.resident:
            return
        key = self.rng.choice(sorted(self.resident))
        at = self.log.at
        self.engine(
            key,
            EngineCrashed(
                "running",
                "backoff",
                at,
                None,
                9,
                True,
                at + 1,
                "cuda-oom",
                "CUDA error: out of memory",
                120.0,
                "",
            ),
        )
        gone = self.resident.pop(key)
        self.log.add("ledger/host", LedgerReleased(key, gone["bytes"], OWNER, "released"))

    def lease(self) -> None:
        self.leases += 1
        stream = f"lease/{self.leases:016x}"
        at = self.log.at
        self.log.add(stream, LeaseRequested("new", "waiting", at, "image", "comfy"))
        self.log.add(stream, LeaseGranted("waiting", "held", at, at + 5400))
        self.log.add(stream, LeaseReleased("held", "released", at + 30, "released"))

    def run(self, total: int) -> None:
        while self.log.count < total:
            roll = self.rng.random()
            if roll < 0.002:
                self.crash()
            elif roll < 0.004:
                self.lease()
            else:
                self.request()


def build(path: Path, total: int) -> int:
    log = LogWriter(path)
    Scenario(log).run(total)
    log.close()
    return log.count


#: The CLI as its console script runs it, reporting on stderr how long ``main`` took (the
#: command's own work, after the interpreter started and imported hostler).
_RUN = (
    "import sys, time; from hostler.cli import main; t = time.perf_counter(); rc = main(); "
    "print(f'WORK {time.perf_counter() - t}', file=sys.stderr); sys.exit(rc)"
)


def cli(log: Path | None, *args: str) -> tuple[float, float]:
    """Seconds one ``hostler state`` takes as a fresh process, and of those its own work.

    With no log: ``hostler --version``, the floor every command pays (interpreter, ``hostler``).
    """
    command = [sys.executable, "-c", _RUN]
    command += ["--version"] if log is None else ["state", "--db", str(log), "--json", *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, check=False, env=os.environ.copy())
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"hostler state failed: {done.stderr.decode()[-500:]}")
    work = next(
        (float(line[5:]) for line in done.stderr.decode().splitlines() if line[:5] == "WORK "),
        elapsed,
    )
    return elapsed, work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", help="where the log goes (default: a temp dir)")
    parser.add_argument("--skip-cold", action="store_true", help="only warm and plain runs")
    args = parser.parse_args(argv)
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="hostler-replay-"))
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "events.db"
    sidecar = log.with_name(log.name + SIDECAR_SUFFIX)
    if not log.exists():
        began = time.perf_counter()
        count = build(log, args.events)
        print(f"built {count:,} events in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    total = args.events
    # the worst case for a warm cache is just before a snapshot point (a whole interval to fold)
    every = SNAPSHOT_EVERY
    points = [
        ("15% (worst)", str(3 * every - 1) if total >= 3 * every else str(total // 7)),
        ("52.5%", str(total * 21 // 40)),
        ("90%", str(total * 9 // 10)),
        ("end", str(total)),
    ]
    moment = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(seconds=total * 0.02 * 0.75)
    points.append(("75% by time", moment.isoformat()))
    results: dict[str, dict[str, float]] = {}

    def measure(label: str, mode: str, extra: list[str], fresh: bool) -> None:
        walls, works = [], []
        for _ in range(args.runs):
            if fresh:
                sidecar.unlink(missing_ok=True)
            wall, work = cli(log, *extra)
            walls.append(wall)
            works.append(work)
        wall, work = statistics.median(walls), statistics.median(works)
        results.setdefault(label, {})[mode] = wall
        results[label][f"{mode} (work)"] = work
        print(f"  {label:<12} {mode:<13} {wall:6.2f} s, work {work:6.3f} s", file=sys.stderr)

    floor = statistics.median(cli(None)[0] for _ in range(args.runs))
    print(f"  start-up floor (hostler --version) {floor:6.2f} s", file=sys.stderr)
    for label, at in points:
        if not args.skip_cold:
            measure(label, "cold", ["--at", at], fresh=True)
        cli(log, "--at", at)  # leaves the snapshots this point needs
        measure(label, "warm", ["--at", at], fresh=False)
        measure(label, "no snapshots", ["--at", at, "--no-snapshots"], fresh=False)
    OUT.mkdir(exist_ok=True)
    document = {"events": total, "startup_floor": floor, "results": results}
    (OUT / "replay.json").write_text(json.dumps(document, indent=2))
    print(f"start-up floor (`hostler --version`): {floor:.2f} s")
    print(f"| point ({total:,} events) | cold | warm | no snapshots |")
    print("|---|---:|---:|---:|")
    for label, row in results.items():
        cells = " | ".join(
            f"{row[m]:.2f} s (work {row[m + ' (work)']:.2f} s)" if m in row else "-"
            for m in ("cold", "warm", "no snapshots")
        )
        print(f"| {label} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
