"""Starting engines (anyio driver): one build per key, room made and reserved as one step.

:class:`Starter` hands out a key's engine once it runs and does not drain (PP1): concurrent
callers join one build, run in the pool's task group so that a caller that gives up cancels
nothing others wait on. A build prices its launch once, makes room for it
(:class:`~hostler.runtime.room.RoomDriver`) and reserves it under one admission lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio

from hostler.clock import Clock
from hostler.drivers.offloop import OffLoop
from hostler.engines.launcher import Launch
from hostler.engines.supervisor import Supervisor
from hostler.errors import CapacityDeniedError, RuntimeClosedError
from hostler.machines.engine import EngineState
from hostler.policies.pool import touch
from hostler.runtime.maker import SupervisorMaker
from hostler.runtime.room import RoomDriver
from hostler.runtime.table import EngineTable, Entry, Flight
from hostler.runtime.tasks import PoolTasks

__all__ = ["Starter"]


class Starter:
    """PP1: a key's engine handed out running, built once however many ask.

    Args:
        table: The pool's entries.
        maker: Makes a key's supervisor on first use.
        tasks: The pool's tasks (builds run there).
        room: Makes room for a start (PP4).
        clock: The pool's clock.
        offloop: Where blocking pricing runs.
    """

    def __init__(
        self,
        table: EngineTable,
        maker: SupervisorMaker,
        *,
        tasks: PoolTasks,
        room: RoomDriver,
        clock: Clock,
        offloop: OffLoop,
    ) -> None:
        self._table = table
        self._maker = maker
        self._tasks = tasks
        self._room = room
        self._clock = clock
        self._io = offloop
        self._admission = anyio.Lock()  # one make-room at a time: two never free the same bytes

    @contextlib.asynccontextmanager
    async def use(self, key: str, cause: str = "request") -> AsyncIterator[int]:
        """Hold ``key``'s engine for one request, building it (and making room) when needed.

        Waits while it drains (PP1: a draining engine takes no new work); while held, the
        engine counts as busy, so it is neither evicted nor idle-stopped under the request.

        Raises:
            RuntimeClosedError: The pool is closing.
            CapacityDeniedError: It cannot fit, even after evicting what could go.
            EngineBusyError: Room had to be drained from a busy engine that did not finish.
            EngineStartError, RestartBudgetError, PluginError: From its supervisor.
        """
        self._tasks.check_open()
        entry = await self._handed_out(key, cause)
        entry.in_use += 1  # no await since it was found running and not draining
        try:
            async with entry.supervisor.request() as port:
                yield port
        finally:
            entry.in_use -= 1
            entry.last_used_at = self._clock.wall()

    async def ensure(self, key: str, cause: str = "request") -> int:
        """PP1: ``key``'s engine running (built once however many ask); return its port."""
        self._tasks.check_open()
        entry = await self._handed_out(key, cause)
        port = entry.supervisor.port
        assert port is not None  # noqa: S101 - handed out running
        return port

    async def price(self, key: str) -> Launch:
        """``key``'s next launch priced now, as a start would price it (preview; PP1)."""
        return await self._io.run(self._maker.supervisor(key).price)

    async def _handed_out(self, key: str, cause: str) -> Entry:
        """PP1: the entry once its engine runs and does not drain, built (once) if need be.

        A build that ends while its engine has been chosen to drain is not handed out: its
        waiters wait for the drain like everyone else, then use it or build it again.
        """
        self._maker.supervisor(key)
        entry = self._table.get(key)
        assert entry is not None  # noqa: S101 - the maker added it
        now = self._clock.wall()
        touched = touch(self._table.as_policy(key, entry, 0), now)
        entry.hits, entry.last_used_at = touched.hits, now
        entry.waiting += 1  # until handed out: the caller increments in_use with no await
        noticed = False
        try:
            while True:
                while entry.draining:
                    await entry.drained.wait()
                    self._tasks.check_open()
                sup = entry.supervisor
                if sup.exited_unseen() and not noticed:
                    # its process died since the watch last looked (a request behind a crash
                    # must wait for the restart, never be sent to the dead port): the crash is
                    # recorded now, and the loop builds it again
                    noticed = True
                    await sup.notice_exit()
                    continue
                if sup.state == EngineState.RUNNING and sup.port is not None and not entry.flight:
                    return entry
                flight = entry.flight
                if flight is None:
                    self._tasks.check_open()
                    flight = entry.flight = Flight()
                    self._tasks.start(self._build, key, entry, flight, cause)
                await flight.wait()
        finally:
            entry.waiting -= 1

    async def _build(self, key: str, entry: Entry, flight: Flight, cause: str) -> None:
        try:
            flight.port = await self._admit_and_start(key, entry, cause)
        except anyio.get_cancelled_exc_class():
            flight.error = RuntimeClosedError(f"{key}: not started: the runtime is closing")
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter, who raises it
            flight.error = exc
        finally:
            entry.flight = None
            flight.done.set()

    async def _admit_and_start(self, key: str, entry: Entry, cause: str) -> int:
        """Make room and reserve as one step under the admission lock, then load unlocked.

        The lock is let go as soon as the ledger holds the engine's footprint (or the start
        ends first), so no other start can plan with room this one is about to take.
        """
        for attempt in range(2):
            await self._admission.acquire()
            held = True
            hopeless: str | None = None

            def reserved() -> None:
                nonlocal held
                if held:
                    held = False
                    self._admission.release()

            try:
                launch = await self._price(entry.supervisor)
                hopeless = None if launch is None else await self._room.make_room(key, launch)
                return await entry.supervisor.ensure_running(
                    cause, on_reserved=reserved, launch=launch
                )
            except CapacityDeniedError as exc:
                if hopeless is not None:  # the ledger refused it, recorded: say why in full
                    raise CapacityDeniedError(f"{hopeless} (the ledger: {exc.message})") from None
                if attempt:
                    raise
                # another daemon took the room between our plan and our reservation: once more
            finally:
                reserved()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _price(self, supervisor: Supervisor) -> Launch | None:
        """This start's one price (blocking work, off the loop); None when pricing failed.

        A price that raised is not this pool's to report: the supervisor prices again for
        the start and records the failure on the engine's stream (SG3).
        """
        try:
            return await self._io.run(supervisor.price)
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException:  # noqa: BLE001 - even SystemExit from a plugin: recorded there
            return None
