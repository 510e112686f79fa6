"""Event log benchmark: hostler vs raw sqlite3 (the ceiling) vs the `eventsourcing` library.

Measures, side by side in one run, each as the median of several interleaved rounds:

* durable single-event appends/s (one commit per event, WAL, synchronous=FULL);
* batched appends/s (100 events per commit);
* single-event appends/s with 8 concurrent appenders (hostler shares commits between them);
* replay events/s over a large log: hostler folds it into machine state; the raw ceiling
  fetches exactly the columns replay reads and ``json.loads`` each payload, nothing else;
  eventsourcing reconstructs its aggregates.

The baselines do the work hostler does, no more, no less: one ``recorded_at`` stamp per commit
(as hostler stamps each commit), the same table and indexes. In each round the candidates run
in alternating order (forward, then reversed), and each figure is the median over rounds of
the ratio measured within the round.

Run: ``uv run python bench/eventlog.py`` (``--quick`` for a smoke run). Results are printed as
a markdown table and written to ``bench/out/eventlog.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hostler import EventStore, event_type, replay
from hostler.events import Event, encode
from hostler.machines.engine import (
    EngineReady,
    EngineSpawned,
    EngineStartRequested,
    EngineStopped,
    EngineStopRequested,
)
from hostler.store.log import format_time

OUT = Path(__file__).parent / "out"


@event_type("bench.ticked")
@dataclass(frozen=True, slots=True)
class Ticked(Event):
    """A payload of the size of a typical lifecycle event."""

    from_state: str
    to_state: str
    at: float
    pid: int
    port: int
    cause: str


def payload(n: int) -> Ticked:
    return Ticked("running", "running", 1_800_000_000.0 + n, 40_000 + n % 1000, 41_000, "request")


# -- raw sqlite3 (the ceiling) ----------------------------------------------------------------

# The same table as hostler's (its indexes included), so raw does the same inserts.
RAW_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, stream_id VARCHAR(200) NOT NULL,
  version INTEGER NOT NULL, type VARCHAR(120) NOT NULL, schema_version INTEGER NOT NULL,
  payload JSON NOT NULL, metadata JSON NOT NULL, recorded_at VARCHAR(32) NOT NULL,
  UNIQUE (stream_id, version))""",
    "CREATE INDEX IF NOT EXISTS ix_events_type_seq ON events (type, seq)",
    "CREATE INDEX IF NOT EXISTS ix_events_recorded_at ON events (recorded_at)",
)
INSERT = (
    "INSERT INTO events (stream_id, version, type, schema_version, payload, metadata, "
    "recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def raw_connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    for statement in RAW_SCHEMA:
        conn.execute(statement)
    return conn


def now_stamp() -> str:
    """One ``recorded_at`` text, as hostler stamps each commit."""
    return format_time(datetime.now(UTC))


def raw_row(stream: str, version: int, event: Event, stamp: str) -> tuple[Any, ...]:
    type_name, schema_version, data = encode(event)
    return (
        stream,
        version,
        type_name,
        schema_version,
        json.dumps(data),
        '{"hostler_version":"bench"}',
        stamp,
    )


def raw_single(path: Path, n: int) -> float:
    conn = raw_connect(path)
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(INSERT, raw_row("s/raw", i + 1, payload(i), now_stamp()))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def raw_batched(path: Path, batches: int, size: int = 100) -> float:
    conn = raw_connect(path)
    start = time.perf_counter()
    for b in range(batches):
        stamp = now_stamp()  # one per commit, like hostler
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            INSERT, [raw_row("s/rawb", b * size + i + 1, payload(i), stamp) for i in range(size)]
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return batches * size / elapsed


def raw_concurrent(path: Path, n: int, threads: int = 8) -> float:
    raw_connect(path).close()
    per = n // threads

    def work(t: int) -> None:
        conn = raw_connect(path)
        for i in range(per):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(INSERT, raw_row(f"s/raw{t}", i + 1, payload(i), now_stamp()))
            conn.execute("COMMIT")
        conn.close()

    return _threaded(work, threads, per)


def raw_fetch_decode(path: Path) -> float:
    """The payload-only ceiling: the columns replay reads, and json.loads of each payload."""
    conn = sqlite3.connect(path)
    start = time.perf_counter()
    count = 0
    loads = json.loads
    for row in conn.execute(
        "SELECT seq, stream_id, version, type, schema_version, payload FROM events ORDER BY seq"
    ):
        loads(row[5])
        count += 1
    elapsed = time.perf_counter() - start
    conn.close()
    return count / elapsed


# -- hostler ------------------------------------------------------------------------------------


def hostler_single(path: Path, n: int) -> float:
    with EventStore.open(path, owner=True) as store:
        start = time.perf_counter()
        for i in range(n):
            store.append("s/h", [payload(i)], expected_version=i)
        return n / (time.perf_counter() - start)


def hostler_batched(path: Path, batches: int, size: int = 100) -> float:
    with EventStore.open(path, owner=True) as store:
        start = time.perf_counter()
        for b in range(batches):
            store.append("s/hb", [payload(i) for i in range(size)], expected_version=b * size)
        return batches * size / (time.perf_counter() - start)


def hostler_concurrent(path: Path, n: int, threads: int = 8) -> tuple[float, float]:
    with EventStore.open(path, owner=True) as store:
        per = n // threads

        def work(t: int) -> None:
            for i in range(per):
                store.append(f"s/h{t}", [payload(i)], expected_version=i)

        rate = _threaded(work, threads, per)
        commits, appends = store.commit_stats
        return rate, appends / commits


def build_lifecycle_log(path: Path, total: int) -> None:
    """A log of ``total`` engine lifecycle events (start, spawned, ready, stop, exited...)."""
    EventStore.open(path).close()  # creates and migrates the schema
    conn = raw_connect(path)
    engines = 1000
    cycle = 5
    rows: list[tuple[Any, ...]] = []
    conn.execute("BEGIN IMMEDIATE")
    written = 0
    version = dict.fromkeys(range(engines), 0)
    at = 1_800_000_000.0
    while written < total:
        for e in range(engines):
            if written >= total:
                break
            stream = f"engine/llamacpp:model{e}:0"
            c = version[e] // cycle
            for step in range(cycle):
                if written >= total:
                    break
                at += 0.001
                event = _cycle_event(step, at, e, c)
                version[e] += 1
                rows.append(raw_row(stream, version[e], event, now_stamp()))
                written += 1
        if len(rows) >= 50_000 or written >= total:
            conn.executemany(INSERT, rows)
            rows.clear()
    conn.execute("COMMIT")
    conn.close()


def _cycle_event(step: int, at: float, e: int, c: int) -> Event:
    if step == 0:
        return EngineStartRequested("stopped", "starting", at, "request")
    if step == 1:
        return EngineSpawned(
            "starting", "starting", at, 10_000 + e, at, "boot", "tok", "sha", 40_000 + e
        )
    if step == 2:
        return EngineReady("starting", "running", at)
    if step == 3:
        return EngineStopRequested("running", "stopping", at, "idle")
    return EngineStopped("stopping", "stopped", at, 0, None)


def hostler_replay(path: Path) -> tuple[float, int]:
    with EventStore.open(path) as store:
        start = time.perf_counter()
        world = replay(store)
        elapsed = time.perf_counter() - start
    assert len(world.engines) == 1000
    return world.events / elapsed, world.events


# -- the eventsourcing library ------------------------------------------------------------------


def _es_app(path: Path) -> Any:
    from eventsourcing.application import Application

    return Application(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}
    )


def _es_aggregate() -> Any:
    from eventsourcing.domain import Aggregate, event

    class Engine(Aggregate):  # type: ignore[misc]
        @event("Registered")  # type: ignore[untyped-decorator]
        def __init__(self, name: str) -> None:
            self.name = name
            self.pid = 0

        @event("Ticked")  # type: ignore[untyped-decorator]
        def tick(
            self, from_state: str, to_state: str, at: float, pid: int, port: int, cause: str
        ) -> None:
            self.pid = pid

    return Engine


_ES_ENGINE: Any = None


def es_engine() -> Any:
    global _ES_ENGINE  # noqa: PLW0603 - one class per process, like a module-level aggregate
    if _ES_ENGINE is None:
        _ES_ENGINE = _es_aggregate()
    return _ES_ENGINE


def _tick(aggregate: Any, i: int) -> None:
    p = payload(i)
    aggregate.tick(
        from_state=p.from_state, to_state=p.to_state, at=p.at, pid=p.pid, port=p.port, cause=p.cause
    )


def es_single(path: Path, n: int) -> float:
    app = _es_app(path)
    aggregate = es_engine()("x")
    app.save(aggregate)
    start = time.perf_counter()
    for i in range(n):
        _tick(aggregate, i)
        app.save(aggregate)
    elapsed = time.perf_counter() - start
    app.close()
    return n / elapsed


def es_batched(path: Path, batches: int, size: int = 100) -> float:
    app = _es_app(path)
    aggregate = es_engine()("x")
    app.save(aggregate)
    start = time.perf_counter()
    for _ in range(batches):
        for i in range(size):
            _tick(aggregate, i)
        app.save(aggregate)
    elapsed = time.perf_counter() - start
    app.close()
    return batches * size / elapsed


def es_concurrent(path: Path, n: int, threads: int = 8) -> float:
    app = _es_app(path)
    per = n // threads
    aggregates = [es_engine()(f"x{t}") for t in range(threads)]
    for aggregate in aggregates:
        app.save(aggregate)

    def work(t: int) -> None:
        for i in range(per):
            _tick(aggregates[t], i)
            app.save(aggregates[t])

    rate = _threaded(work, threads, per)
    app.close()
    return rate


def es_build(path: Path, total: int) -> list[Any]:
    app = _es_app(path)
    ids = []
    per = max(1, total // 1000)
    for _ in range(total // per):
        aggregate = es_engine()("x")
        for i in range(per - 1):  # the Registered event counts as one
            _tick(aggregate, i)
        app.save(aggregate)
        ids.append(aggregate.id)
    app.close()
    return ids


def es_reconstruct(path: Path, ids: list[Any], total: int) -> float:
    app = _es_app(path)
    start = time.perf_counter()
    for aggregate_id in ids:
        app.repository.get(aggregate_id)
    elapsed = time.perf_counter() - start
    app.close()
    return total / elapsed


# -- harness ----------------------------------------------------------------------------------


def _threaded(work: Callable[[int], None], threads: int, per: int) -> float:
    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return threads * per / (time.perf_counter() - start)


def _fresh(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}-{time.perf_counter_ns()}.db"
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--single", type=int, default=400, help="events per single-append round")
    parser.add_argument("--batches", type=int, default=100, help="100-event batches per round")
    parser.add_argument("--concurrent", type=int, default=800, help="events per 8-thread round")
    parser.add_argument("--replay-events", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--replay-rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--dir", help="where the databases go (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.single, args.batches, args.concurrent = 200, 10, 400
        args.replay_events, args.rounds, args.replay_rounds = 20_000, 2, 2

    tmp = Path(args.dir or tempfile.mkdtemp(prefix="hostler-bench-"))
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[float]]] = {}

    def record(metric: str, who: str, value: float) -> None:
        results.setdefault(metric, {}).setdefault(who, []).append(value)
        print(f"  {metric:<22} {who:<14} {value:>12,.0f}/s", file=sys.stderr, flush=True)

    def in_turn(r: int, candidates: list[tuple[str, Callable[[], None]]]) -> None:
        """Run one round's candidates, forward in even rounds and reversed in odd ones."""
        for _, run in candidates if r % 2 == 0 else candidates[::-1]:
            run()

    def hostler_concurrent_round() -> None:
        rate, per_commit = hostler_concurrent(_fresh(tmp, "hc"), args.concurrent)
        record("concurrent8", "hostler", rate)
        results.setdefault("appends_per_commit", {}).setdefault("hostler", []).append(per_commit)

    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        in_turn(
            r,
            [
                ("raw", lambda: record("single", RAW, raw_single(_fresh(tmp, "raw"), args.single))),
                (
                    "h",
                    lambda: record(
                        "single", "hostler", hostler_single(_fresh(tmp, "h"), args.single)
                    ),
                ),
                ("es", lambda: record("single", ES, es_single(_fresh(tmp, "es"), args.single))),
            ],
        )
        in_turn(
            r,
            [
                (
                    "raw",
                    lambda: record("batched", RAW, raw_batched(_fresh(tmp, "rawb"), args.batches)),
                ),
                (
                    "h",
                    lambda: record(
                        "batched", "hostler", hostler_batched(_fresh(tmp, "hb"), args.batches)
                    ),
                ),
                ("es", lambda: record("batched", ES, es_batched(_fresh(tmp, "esb"), args.batches))),
            ],
        )
        in_turn(
            r,
            [
                (
                    "raw",
                    lambda: record(
                        "concurrent8", RAW, raw_concurrent(_fresh(tmp, "rawc"), args.concurrent)
                    ),
                ),
                ("h", hostler_concurrent_round),
                (
                    "es",
                    lambda: record(
                        "concurrent8", ES, es_concurrent(_fresh(tmp, "esc"), args.concurrent)
                    ),
                ),
            ],
        )
        for leftover in tmp.glob("*.db*"):
            leftover.unlink()

    print(f"building replay logs of {args.replay_events:,} events", file=sys.stderr)
    log = tmp / "replay.db"
    build_lifecycle_log(log, args.replay_events)
    es_log = tmp / "replay-es.db"
    ids = es_build(es_log, args.replay_events)
    es_total = len(ids) * max(1, args.replay_events // 1000)
    for r in range(args.replay_rounds):
        print(f"replay round {r + 1}/{args.replay_rounds}", file=sys.stderr)
        in_turn(
            r,
            [
                ("raw", lambda: record("replay", CEILING, raw_fetch_decode(log))),
                ("h", lambda: record("replay", "hostler", hostler_replay(log)[0])),
                ("es", lambda: record("replay", ES, es_reconstruct(es_log, ids, es_total))),
            ],
        )

    medians = {m: {who: statistics.median(v) for who, v in by.items()} for m, by in results.items()}
    ratios = ratios_of(results)
    report = {
        "medians": medians,
        "ratios": ratios,
        "samples": results,
        "params": vars(args) | {"dir": str(tmp)},
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "eventlog.json").write_text(json.dumps(report, indent=2))
    print(render(medians, ratios))
    return 0


RAW = "raw sqlite3"
CEILING = "raw fetch+json"
ES = "eventsourcing"
METRICS = (("single", RAW), ("batched", RAW), ("concurrent8", RAW), ("replay", CEILING))


def ratios_of(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per metric: the median over rounds of hostler's ratio to each baseline in that round."""
    out: dict[str, dict[str, float]] = {}
    for metric, raw_key in METRICS:
        by = results.get(metric)
        if not by:
            continue
        ours = by["hostler"]
        out[metric] = {
            "raw": statistics.median(h / b for h, b in zip(ours, by[raw_key], strict=True)),
            "eventsourcing": statistics.median(h / b for h, b in zip(ours, by[ES], strict=True)),
        }
    return out


def render(medians: dict[str, dict[str, float]], ratios: dict[str, dict[str, float]]) -> str:
    lines = [
        "| metric | raw sqlite3 | hostler | eventsourcing | hostler / raw | hostler / eventsourcing |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for metric, raw_key in METRICS:
        row = medians.get(metric)
        if not row:
            continue
        raw, ours, es = row[raw_key], row["hostler"], row[ES]
        lines.append(
            f"| {metric} (events/s) | {raw:,.0f} | {ours:,.0f} | {es:,.0f} | "
            f"{ratios[metric]['raw']:.2f}× | {ratios[metric]['eventsourcing']:.2f}× |"
        )
    lines.append("\n(rates: medians of rounds; ratios: medians of the per-round ratios)")
    if "appends_per_commit" in medians:
        lines.append(
            f"hostler, 8 appenders: {medians['appends_per_commit']['hostler']:.1f} appends per commit"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
