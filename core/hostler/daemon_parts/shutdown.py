"""The daemon's end: every engine it owns stopped (reason ``shutdown``), and the end recorded.

SF4: what the log refused is tried once more; what still is not in is reported, and the next
start records the gap (no ``daemon.stopped`` is written then).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio

from hostler.clock import Clock
from hostler.daemon_parts.upkeep import record_outages
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import OffLoop
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.engines.supervisor import Supervisor
from hostler.errors import HostlerError
from hostler.events.daemon import DaemonStopped
from hostler.machines.engine import StopReason
from hostler.runtime.facade import Runtime
from hostler.store.log import EventStore

__all__ = ["shut_down", "stop_one"]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name


async def shut_down(
    store: EventStore,
    cause: str,
    *,
    runtime: Runtime | None,
    health: LogHealth,
    ledger: HostLedger | None,
    recorded_start: bool,
    offloop: OffLoop,
    clock: Clock,
) -> None:
    """Stop every engine of ``runtime`` (none before it was made) and record the end.

    ``recorded_start``: this daemon recorded its ``daemon.started`` (else a
    ``daemon.stopped`` would pair with another's, and none is written).
    """

    def supervisors() -> dict[str, Supervisor]:
        return {} if runtime is None else runtime.supervisors()

    decision = {"cause": cause}
    if runtime is not None:
        # first: an answer cut by these stops reads as a shutdown, and a request queued
        # behind one is refused (503 shutting-down) instead of starting its engine again
        runtime.stop_taking_work()
    async with anyio.create_task_group() as stopping:
        for supervisor in supervisors().values():
            stopping.start_soon(stop_one, supervisor, StopReason.SHUTDOWN, decision)
    # SF4: what the log refused is tried once more; what still is not in is reported now
    # and, at the next start, as a gap (daemon.gap).
    for supervisor in supervisors().values():
        if not await supervisor.flush(force=True):
            break  # the log still refuses: one more wait per engine would only delay exit
    unwritten = sum(len(s.engine.pending) for s in supervisors().values())
    await record_outages(store, health, offloop)
    if ledger is not None and ledger.owed:
        try:
            await offloop.run(ledger.settle_owed)
        except HostlerError as exc:
            log.error(  # noqa: TRY400 - one line is the point
                "hostler: ledger releases of %s still owed at exit (%s); the ledger frees "
                "them at its next decision, their engines being gone (OW2)",
                ", ".join(sorted(ledger.owed)),
                exc.message,
            )
    if not recorded_start:
        return  # no daemon.started of ours: a daemon.stopped would pair with another's
    if unwritten:
        log.error(
            "hostler: %d events could not be written before exit (%s); every engine was "
            "stopped all the same, and the next start records the gap",
            unwritten,
            health.error,
        )
        return  # no daemon.stopped: the next start must see that this end is unrecorded
    try:
        await offloop.run(
            lambda: store.append(
                DAEMON_STREAM,
                [DaemonStopped(clock.wall(), os.getpid())],
                expected_version=None,
            )
        )
    except HostlerError as exc:
        log.error("hostler: could not record the shutdown: %s", exc.message)  # noqa: TRY400


async def stop_one(supervisor: Supervisor, reason: StopReason, decision: dict[str, Any]) -> None:
    """Stop one engine, recorded; if the log cannot take it, stop it all the same."""
    try:
        await supervisor.stop(reason, decision, unrecorded_ok=True)
    except HostlerError as exc:
        log.error(  # noqa: TRY400 - one line is the point
            "hostler: %s: could not record its stop (%s); stopping it anyway",
            supervisor.key,
            exc.message,
        )
        if not await supervisor.kill_unrecorded():
            log.error("hostler: %s: its group outlived KILL", supervisor.key)  # noqa: TRY400
