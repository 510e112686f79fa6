"""Restart = replay + reconcile: adopt what is still ours, report what is lost, reap strays.

After a daemon restart, every engine the log believes alive is checked against the live process
table: same boot, same pid, same start time, our launch token, the same command line, and it
answers its health probe → **adopted** (no reload; its warm cache survives). Otherwise it is
**lost**. A process carrying a launch token of this data directory that no live log entry owns
is **reaped**. Processes without our token — or with another daemon's — are never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from hostler.drivers.offloop import OffLoop
from hostler.engines.http import probe_status
from hostler.engines.process import (
    ProcessIdentity,
    identity_matches,
    terminate_group,
    token_holders,
)
from hostler.events.daemon import DAEMON_STREAM, EngineReaped
from hostler.machines.engine import Engine, EngineState
from hostler.replay import commit
from hostler.store.log import EventStore

__all__ = ["DAEMON_STREAM", "EngineReaped", "Outcome", "find_strays", "reconcile"]

_ALIVE = {EngineState.STARTING, EngineState.RUNNING, EngineState.STOPPING, EngineState.ADOPTING}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What reconcile decided for one engine key (or one stray process)."""

    key: str
    result: str  # "adopted", "lost" or "reaped"
    pid: int | None
    detail: str = ""
    identity: ProcessIdentity | None = None
    token: str | None = None
    foreign: bool = False  # held by another live daemon: nothing of it is ours to release


def identity_of(engine: Engine) -> ProcessIdentity | None:
    """The spawn record the log holds for an engine, if complete."""
    facts = engine.identity
    if engine.pid is None or not facts:
        return None
    return ProcessIdentity(
        pid=engine.pid,
        create_time=float(facts["create_time"]),
        boot_id=str(facts["boot_id"]),
        launch_token=str(facts["launch_token"]),
        argv_fingerprint=str(facts["argv_fingerprint"]),
        port=int(facts["port"]),
    )


async def reconcile(
    store: EventStore,
    engines: Mapping[str, Engine],
    *,
    token_prefix: str,
    daemon_pid: int,
    readiness_path: Callable[[str], str],
    clock: Callable[[], float],
    offloop: OffLoop | None = None,
    held_by_other: Callable[[str], str | None] | None = None,
) -> list[Outcome]:
    """Adopt or lose every engine the log believes alive, then reap strays; record each.

    ``held_by_other(token)`` names the live daemon, other than this one, whose ledger
    reservation pays for the engine launched with ``token`` (None when none does). Such an
    engine is somebody else's — a copied data directory, a second daemon that got past the
    lock — and is neither adopted nor signalled (OW5): it is recorded lost here, untouched.
    Log writes and process-table scans run off the event loop.
    """
    owner_of = held_by_other or (lambda _token: None)
    io = offloop or OffLoop()
    outcomes: list[Outcome] = []

    async def record(engine: Engine) -> None:
        await io.run(lambda: commit(store, engine, metadata={"actor": "reconcile"}))

    for key, engine in sorted(engines.items()):
        if engine.state not in _ALIVE:
            continue
        if engine.state != EngineState.ADOPTING:
            engine.fire("begin_adoption", at=clock(), daemon_pid=daemon_pid)
            await record(engine)
        identity = identity_of(engine)
        other = await io.run(owner_of, identity.launch_token) if identity else None
        if identity is None:
            why = "the log has no spawn record for it"
        elif other is not None:
            why = (
                f"pid {identity.pid} is held by another live daemon ({other}); "
                "left alone (a copied data directory?)"
            )
        else:
            matches, why = await io.run(identity_matches, identity)
            if matches:
                status = await probe_status(identity.port, readiness_path(key), wait=3)
                if status is not None and 200 <= status < 300:
                    engine.fire("adopted", at=clock(), pid=identity.pid)
                    await record(engine)
                    outcomes.append(
                        Outcome(
                            key,
                            "adopted",
                            identity.pid,
                            identity=identity,
                            token=identity.launch_token,
                        )
                    )
                    continue
                why = f"pid {identity.pid} is ours but does not answer its health probe"
                ended = await terminate_group(identity.pid, identity=identity)
                if not ended.gone:
                    why += f"; {ended.detail}"
        engine.fire("lost", at=clock(), cause=why)
        await record(engine)
        outcomes.append(
            Outcome(
                key,
                "lost",
                identity.pid if identity else None,
                why,
                token=identity.launch_token if identity else None,
                foreign=other is not None,
            )
        )
    kept = {o.pid for o in outcomes if o.result == "adopted"}
    strays = await io.run(lambda: find_strays(token_prefix, exclude=kept))
    for pid, token, command in strays:
        if await io.run(owner_of, token) is not None:
            continue  # another live daemon's engine: never ours to reap
        await terminate_group(pid)
        await io.run(
            lambda p=pid, t=token, c=command: store.append(
                DAEMON_STREAM,
                [EngineReaped(clock(), p, t, c)],
                expected_version=None,
                metadata={"actor": "reconcile"},
            )
        )
        outcomes.append(Outcome("", "reaped", pid, command, token=token))
    return outcomes


def find_strays(token_prefix: str, *, exclude: set[int | None]) -> list[tuple[int, str, str]]:
    """Processes whose launch token belongs to this data directory, except ``exclude``.

    Only session leaders are returned (an engine's children go with its group).
    """
    strays = []
    for process, token in token_holders(lambda token: token.startswith(f"{token_prefix}:")):
        if process.pid in exclude or process.pid != _session_id(process.pid):
            continue
        try:
            strays.append((process.pid, token, " ".join(process.cmdline())[:500]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return strays


def _session_id(pid: int) -> int:
    try:
        return os.getsid(pid)
    except OSError:
        return -1
