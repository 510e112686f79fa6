"""``hostler demo``: drive the lifecycle machines through a scripted story into a real log.

No engine process is launched: the observations (spawned, ready, crashed...) are scripted,
the decisions and the log are real. It shows what the log records and how to read it back.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from hostler.cli.common import add_log_options
from hostler.cli.render import TableWriter
from hostler.cli.state import format_world
from hostler.machines import Engine, Lease, Reservation, StopReason
from hostler.paths import default_data_dir
from hostler.replay import commit, replay
from hostler.store.log import EventStore

__all__ = ["add_parser", "run", "run_story"]

GIB = 1024**3
MIB = 1024**2


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="write a scripted engine story into a fresh demo log and show it",
        description="Writes DATA_DIR/demo/events.db anew (replacing an earlier demo log), "
        "then prints its events and the state replayed from them.",
    )
    add_log_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the story and print it."""
    if args.db:
        path = Path(args.db).expanduser()
    else:
        base = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
        path = base / "demo" / "events.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with EventStore.open(path, owner=True) as store:
        run_story(store, start=time.time(), daemon_pid=os.getpid())
        print(f"demo event log: {path}\n")
        for line in TableWriter().lines(store.read_all()):
            print(line)
        print()
        print("\n".join(format_world(replay(store))))
    print(
        "\nexplore it:\n"
        f"  hostler events --db {path} --type engine.crashed --json\n"
        f"  hostler state --db {path} --until-seq 8"
    )
    return 0


def run_story(store: EventStore, *, start: float, daemon_pid: int) -> None:
    """Fire the demo's scripted observations through the machines, committing each step."""
    owner = f"daemon:{daemon_pid}"
    token = f"demo-{daemon_pid}"
    small, big = "llamacpp:smollm2-135m:0", "llamacpp:qwen2.5-14b:0"
    budget = 8 * GIB
    small_bytes = 420 * MIB
    meta = {"actor": "demo", "policy_version": "demo-1"}

    def at(offset: float) -> float:
        return round(start + offset, 3)

    res_small = Reservation(small)
    res_small.fire("request", at=at(0.0), bytes=small_bytes, owner=owner)
    res_small.fire("grant", at=at(0.0), bytes=small_bytes, budget=budget, committed_other=0)
    commit(store, res_small, metadata=meta)

    engine = Engine(small)
    engine.fire("start", at=at(0.01), cause="request")
    engine.fire(
        "spawned",
        at=at(0.02),
        pid=40001,
        create_time=at(0.02),
        boot_id="demo-boot",
        launch_token=token,
        argv_fingerprint="sha256:demo",
        port=41001,
    )
    engine.fire("ready", at=at(0.45))
    commit(store, engine, metadata=meta)

    lease = Lease("llm-1")
    lease.fire("request", at=at(0.5), slot="llm", holder=small)
    lease.fire("grant", at=at(0.5), expires_at=at(30.5))
    commit(store, lease, metadata=meta)

    res_big = Reservation(big)
    res_big.fire("request", at=at(1.0), bytes=9 * GIB, owner=owner)
    shortfall = 9 * GIB + small_bytes - budget
    res_big.fire(
        "deny",
        at=at(1.0),
        shortfall=shortfall,
        reason="budget",
        budget=budget,
        committed_other=small_bytes,
    )
    commit(store, res_big, metadata=meta)

    engine.fire("crashed", at=at(5.0), exit_code=None, signal=9, reached_ready=True, retry_at=at(6))
    commit(store, engine, metadata=meta)
    engine.fire("start", at=at(6.0), cause="restart")
    engine.fire(
        "spawned",
        at=at(6.01),
        pid=40002,
        create_time=at(6.01),
        boot_id="demo-boot",
        launch_token=token,
        argv_fingerprint="sha256:demo",
        port=41002,
    )
    engine.fire("ready", at=at(6.4))
    commit(store, engine, metadata=meta)

    engine.fire("stop", at=at(306.4), reason=StopReason.IDLE)
    engine.fire("exited", at=at(306.6), exit_code=0, signal=None)
    commit(store, engine, metadata=meta)
    lease.fire("release", at=at(306.6), cause="engine stopped")
    commit(store, lease, metadata=meta)
    res_small.fire("release", at=at(306.6), cause="engine stopped")
    commit(store, res_small, metadata=meta)
