"""The daemon's upkeep: owed ledger releases settled (OW7), ended log outages recorded (SF1)."""

from __future__ import annotations

import logging

from hostler.clock import Clock
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.loghealth import LogHealth
from hostler.drivers.offloop import OffLoop
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.errors import HostlerError
from hostler.events.daemon import DaemonLogRecovered
from hostler.runtime.facade import Runtime
from hostler.store.log import EventStore

__all__ = ["Upkeep", "record_outages"]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name


class Upkeep:
    """Settles owed ledger releases, checks the ledger file, and records ended log outages.

    Args:
        ledger: The host ledger.
        store: The daemon's event log.
        health: The log's health, as its writers report it.
        runtime: The runtime (whether any engine has events waiting for the log).
        clock: Paces the upkeep.
        offloop: Runs the blocking ledger and log work.
    """

    def __init__(
        self,
        ledger: HostLedger,
        store: EventStore,
        health: LogHealth,
        runtime: Runtime,
        *,
        clock: Clock,
        offloop: OffLoop,
    ) -> None:
        self._ledger = ledger
        self._store = store
        self._health = health
        self._runtime = runtime
        self._clock = clock
        self._io = offloop

    async def run(self, every: float = 1.0) -> None:
        """Each second settle owed ledger releases (OW7) and record ended log outages (SF1).

        Every fifth second, also check the ledger file (OW6).
        """
        ledger, store, health = self._ledger, self._store, self._health
        ticks = 0
        complained = ""
        while True:
            await self._clock.sleep(every)
            ticks += 1
            try:
                if ledger.owed:
                    await self._io.run(ledger.settle_owed)
                if ticks % 5 == 0:
                    await self._io.run(ledger.check_file)
                complained = ""
            except HostlerError as exc:
                if exc.message != complained:
                    log.error("hostler: the ledger: %s", exc.message)  # noqa: TRY400
                    complained = exc.message
            if not health.ok and not self._anything_pending():
                await self._probe_log()
            await record_outages(store, health, self._io)

    def _anything_pending(self) -> bool:
        """Some engine holds events the log has not taken yet."""
        return any(s.engine.pending for s in self._runtime.supervisors().values())

    async def _probe_log(self) -> None:
        """SF1: try a failing log with the outage's own record when nothing else waits.

        Without it, an outage during which nothing was left pending would never be seen to end.
        """
        store, health = self._store, self._health
        now = self._clock.wall()
        since = health.failing_since or now
        event = DaemonLogRecovered(since, now, health.error, health.code, health.delayed)
        try:
            await self._io.run(lambda: store.append(DAEMON_STREAM, [event], expected_version=None))
        except HostlerError:
            return
        health.wrote(now, recorded=True)


async def record_outages(store: EventStore, health: LogHealth, offloop: OffLoop) -> None:
    """SF1: the log outages that ended, recorded (put back to try again when the log refuses)."""
    ended = health.take_ended()
    if not ended:
        return
    events = [DaemonLogRecovered(o.since, o.until, o.error, o.code, o.delayed) for o in ended]
    try:
        await offloop.run(lambda: store.append(DAEMON_STREAM, events, expected_version=None))
    except HostlerError:
        health.requeue(ended)
