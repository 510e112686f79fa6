"""``hostler demo``: a real engine's story into a fresh event log, then read it back.

By default a real ``llama-server`` runs a tiny model it makes (see :mod:`live_demo`);
``--scripted`` drives the lifecycle machines with scripted observations instead (no engine,
the same log), which also shows GPU leases and a denied reservation.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from hostler.capacity.units import GIB, MIB
from hostler.cli.events import event_row
from hostler.cli.live_demo import Say, run_live
from hostler.cli.render import TableWriter
from hostler.cli.state import format_world
from hostler.errors import StoreNotEmptyError, UsageError
from hostler.machines import Engine, Lease, Reservation, StopReason
from hostler.paths import default_data_dir
from hostler.replay import commit, replay
from hostler.store.connect import display_name, sqlite_path_of
from hostler.store.log import EventStore

__all__ = ["run", "run_story"]


def run(args: argparse.Namespace) -> int:
    """Write the story and print it."""
    base = args.data_dir or default_data_dir()
    url = args.db if args.db and sqlite_path_of(args.db) is None else None
    if url is not None:
        path = base / "demo" / "events.db"  # the engine's files; the log is the database's
    elif args.db:
        # Absolute: the engine runs elsewhere and is handed paths beside the log.
        path = Path(args.db).absolute()  # --db: expanded and resolved already
    else:
        path = base / "demo" / "events.db"
    if url is None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    if url is None and args.host_name is not None:
        raise UsageError(
            f"--host-name {args.host_name}: a file is one host's log; hosts share a database "
            "log (docs/fleet.md)"
        )
    with EventStore.open(url or path, owner=True, host=args.host_name) as store:
        held = store.count() if url is not None else 0
        if held:  # a database is never emptied by the demo: it may be someone's log
            raise StoreNotEmptyError(
                f"{store.name}: holds {held} events; the demo writes into an empty log only "
                "(give an empty database, or a file)"
            )
        if args.scripted:
            run_story(store, start=time.time(), daemon_pid=os.getpid())
        else:
            model: Path | None = args.model
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            run_live(store, path.parent, model, Say())
            print()
        shown = display_name(url or path)
        if args.host_name is not None:  # the commands below must run as printed
            shown = f"{shown} --host-name {args.host_name}"
        print(f"demo event log: {store.name}\n")
        for line in TableWriter().lines(event_row(r) for r in store.read_all()):
            print(line)
        print()
        print("\n".join(format_world(replay(store))))
    print(
        "\nexplore it:\n"
        f"  hostler events --db {shown} --type engine.crashed --json\n"
        f"  hostler state --db {shown} --until-seq 4"
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

    engine = Engine(small)

    def spawned(moment: float, pid: int, port: int) -> None:
        engine.fire(
            "spawned",
            at=moment,
            pid=pid,
            create_time=moment,
            boot_id="demo-boot",
            launch_token=token,
            argv_fingerprint="sha256:demo",
            port=port,
        )

    res_small = Reservation(small)
    res_small.fire("request", at=at(0.0), bytes=small_bytes, owner=owner)
    res_small.fire("grant", at=at(0.0), bytes=small_bytes, budget=budget, committed_other=0)
    commit(store, res_small, metadata=meta)

    engine.fire("start", at=at(0.01), cause="request")
    spawned(at(0.02), 40001, 41001)
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
    spawned(at(6.01), 40002, 41002)
    engine.fire("ready", at=at(6.4))
    commit(store, engine, metadata=meta)

    engine.fire("stop", at=at(306.4), reason=StopReason.IDLE)
    engine.fire("exited", at=at(306.6), exit_code=0, signal=None)
    commit(store, engine, metadata=meta)
    lease.fire("release", at=at(306.6), cause="engine stopped")
    commit(store, lease, metadata=meta)
    res_small.fire("release", at=at(306.6), cause="engine stopped")
    commit(store, res_small, metadata=meta)
