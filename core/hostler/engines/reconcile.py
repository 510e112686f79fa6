"""Restart = replay + reconcile: adopt what is still ours, report what is lost, reap strays.

After a daemon restart, every engine the log believes alive is checked against the live process
table: same boot, same pid, same start time, our launch token, the same command line, and it
answers its health probe → **adopted** (no reload; its warm cache survives). Otherwise it is
**lost**. A process carrying a launch token of this data directory that no live log entry owns
is **reaped**. Processes without our token — or with another daemon's — are never touched.

A pidfd is opened on each recorded process *before* its identity is checked, so the process
that passed the check is the one the pidfd names; an adopted engine's pidfd goes to its
supervisor, which signals only through it (SG4). Strays are identified the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import psutil

from hostler.drivers.offloop import OffLoop
from hostler.engines.http import probe_status
from hostler.engines.launched import spec_from_record
from hostler.engines.process import (
    Pidfd,
    ProcessIdentity,
    argv_fingerprint,
    open_verified,
    terminate_group,
    token_holders,
)
from hostler.events.daemon import DAEMON_STREAM, EngineReaped
from hostler.machines.engine import Engine, EngineState
from hostler.plugin import LaunchSpec
from hostler.probes.host import boot_id, started_since_boot
from hostler.replay import commit
from hostler.store.log import EventStore

__all__ = [
    "DAEMON_STREAM",
    "EngineReaped",
    "Outcome",
    "Stray",
    "find_strays",
    "reap",
    "reconcile",
]

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
    pidfd: Pidfd | None = None  # an adopted engine's, opened before its identity was checked
    spec: LaunchSpec | None = None  # what an adopted engine was launched with, if recorded


class Stray(NamedTuple):
    """A process that carries this data directory's launch token, but no live entry owns."""

    pid: int
    token: str
    command: str
    identity: ProcessIdentity  # as found, so that it is re-checked before each signal


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
        since_boot=_number_or_none(facts.get("since_boot")),
    )


def launched_spec(key: str, engine: Engine) -> LaunchSpec | None:
    """What the engine's live process was launched with, as its spawn record says (v3)."""
    facts = engine.identity
    port = None if not facts else facts.get("port")
    if not facts or type(port) is not int:
        return None
    return spec_from_record(key, port, facts.get("launched"))


def _number_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


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
    copied_from: str | None = None,
) -> list[Outcome]:
    """Adopt or lose every engine the log believes alive, then reap strays; record each.

    ``held_by_other(token)`` names the live daemon, other than this one, whose ledger
    reservation pays for the engine launched with ``token`` (None when none does). Such an
    engine is somebody else's — a copied data directory, a second daemon that got past the
    lock — and is neither adopted nor signalled (OW5): it is recorded lost here, untouched.
    ``copied_from`` names the daemon this log's last start recorded when that daemon still
    runs (this data directory is a copy of a live one's, whatever ledger it uses): every
    engine the log holds is that daemon's, and no stray is reaped.
    Log writes and process-table scans run off the event loop. Each adopted outcome carries
    the pidfd opened on its engine before the identity check (SG4): the caller hands it to
    the engine's supervisor, or closes it.
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
        elif copied_from is not None:
            other = copied_from
            why = (
                f"pid {identity.pid} belongs to the daemon this log was copied from "
                f"({copied_from}, still running); left alone"
            )
        else:
            pidfd, why = await _check(identity, readiness_path(key), io)
            if pidfd is not None:
                try:
                    engine.fire("adopted", at=clock(), pid=identity.pid)
                    await record(engine)
                except BaseException:
                    pidfd.close()
                    raise
                outcomes.append(
                    Outcome(
                        key,
                        "adopted",
                        identity.pid,
                        identity=identity,
                        token=identity.launch_token,
                        pidfd=pidfd,
                        spec=launched_spec(key, engine),
                    )
                )
                continue
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
    if copied_from is not None:
        return outcomes  # its processes carry this directory's tokens: none is a stray here
    kept = {o.pid for o in outcomes if o.result == "adopted"}
    strays = await io.run(lambda: find_strays(token_prefix, exclude=kept))
    for stray in strays:
        if await io.run(owner_of, stray.token) is not None:
            continue  # another live daemon's engine: never ours to reap
        await reap(stray, io)
        await io.run(
            lambda s=stray: store.append(
                DAEMON_STREAM,
                [EngineReaped(clock(), s.pid, s.token, s.command)],
                expected_version=None,
                metadata={"actor": "reconcile"},
            )
        )
        outcomes.append(Outcome("", "reaped", stray.pid, stray.command, token=stray.token))
    return outcomes


async def reap(stray: Stray, io: OffLoop | None = None) -> None:
    """Stop a stray's group: a pidfd opened, its identity as found re-checked, then signals.

    One that is no longer the process that was found (it exited, its pid was reused) is left
    alone (SG4).
    """
    pidfd, why = await (io or OffLoop()).run(open_verified, stray.identity)
    try:
        if not why:
            await terminate_group(stray.pid, identity=stray.identity, pidfd=pidfd)
    finally:
        pidfd.close()


async def _check(
    identity: ProcessIdentity, readiness_path: str, io: OffLoop
) -> tuple[Pidfd | None, str]:
    """The pidfd on a recorded engine that is still ours and healthy, else why it is not.

    The pidfd is opened before the identity is checked (SG4). One that is ours but does not
    answer its health probe is stopped here, through that pidfd.
    """
    pidfd, why = await io.run(open_verified, identity)
    if why:
        pidfd.close()
        return None, why
    healthy = False
    try:
        status = await probe_status(identity.port, readiness_path, wait=3)
        healthy = status is not None and 200 <= status < 300
        if healthy:
            return pidfd, ""
        why = f"pid {identity.pid} is ours but does not answer its health probe"
        ended = await terminate_group(identity.pid, identity=identity, pidfd=pidfd)
        if not ended.gone:
            why += f"; {ended.detail}"
    finally:
        if not healthy:
            pidfd.close()
    return None, why


def find_strays(token_prefix: str, *, exclude: set[int | None]) -> list[Stray]:
    """Processes whose launch token belongs to this data directory, except ``exclude``.

    Only session leaders are returned (an engine's children go with its group), each with
    its identity as found (so that a reaper re-checks it before signalling).
    """
    strays = []
    host = boot_id()
    for process, token in token_holders(lambda token: token.startswith(f"{token_prefix}:")):
        if process.pid in exclude or process.pid != _session_id(process.pid):
            continue
        try:
            argv = process.cmdline()
            identity = ProcessIdentity(
                pid=process.pid,
                create_time=process.create_time(),
                boot_id=host,
                launch_token=token,
                argv_fingerprint=argv_fingerprint(argv),
                port=0,
                since_boot=started_since_boot(process.pid),
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        strays.append(Stray(process.pid, token, " ".join(argv)[:500], identity))
    return strays


def _session_id(pid: int) -> int:
    try:
        return os.getsid(pid)
    except OSError:
        return -1
