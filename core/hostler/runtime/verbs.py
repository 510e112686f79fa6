"""The pool's verbs beyond a start: unload, release idle, retire, close, reconcile (PP6–PP10).

:class:`Unloader` gives engines up (PP6 one idle engine, PP7 every idle one, PP9 all as their
work ends, PP8 all now); :class:`Reconciler` holds a named model at a replica count (PP10).
Both drain through :class:`~hostler.runtime.room.RoomDriver`, the one place a drain is done.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from hostler.capacity.keys import parse_key
from hostler.engines.supervisor import Supervisor
from hostler.errors import EngineBusyError, HostlerError, UsageError
from hostler.runtime.room import RoomDriver, StopNotice
from hostler.runtime.starts import Starter
from hostler.runtime.table import EngineTable
from hostler.runtime.tasks import PoolTasks

__all__ = ["MAX_REPLICAS", "ReconcileReport", "Reconciler", "Unloader"]

log = logging.getLogger(__name__)

#: The most replicas one model may be reconciled to (a typo, not a wish, past it).
MAX_REPLICAS = 64


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What a reconcile did (PP10): engines evicted, started, and those that failed (why)."""

    evicted: tuple[str, ...]
    started: tuple[str, ...]
    failed: Mapping[str, str]


class Unloader:
    """Unloads engines: one idle, every idle, all as their work ends, all now.

    Args:
        table: The pool's entries.
        room: Drains an engine (PP5).
        tasks: The pool's tasks (retire takes no new work).
        stops: Told just before an engine is stopped at close.
    """

    def __init__(
        self, table: EngineTable, room: RoomDriver, tasks: PoolTasks, stops: StopNotice
    ) -> None:
        self._table = table
        self._room = room
        self._tasks = tasks
        self._stops = stops

    async def unload_idle(self, key: str, why: dict[str, Any] | None = None) -> bool:
        """PP6: unload ``key`` now if it is idle; False when it is not resident.

        Joins an eviction already draining it. ``why`` is recorded as the stop's decision
        (default: PP6, an operator's unload).

        Raises:
            UsageError: It is pinned (PP17).
            EngineBusyError: It serves or waits on requests (no drain wait: a person asked).
        """
        entry = self._table.get(key)
        if entry is None or not entry.up:
            return False
        if key in self._table.pinned:
            raise UsageError(
                f"{key} is pinned (the config keeps it resident, PP17); unpin it to unload it"
            )
        if entry.draining:
            await entry.drained.wait()
            return not entry.up
        if self._table.busy(key, entry, queued=True):
            raise EngineBusyError(f"{key} is busy; not unloading it (retry when its requests end)")
        why = why or {"rule": "PP6", "cause": "unload-idle"}
        return await self._room.drain(key, None, why, 0.0)

    async def release_idle(self) -> list[str]:
        """PP7: unload every idle engine; return the keys that were busy (left resident)."""
        busy: list[str] = []
        for key in self._table.engine_keys():
            if key in self._table.pinned:
                continue  # PP17: kept resident through a reset too
            try:
                await self.unload_idle(key)
            except EngineBusyError:
                busy.append(key)
            except HostlerError as exc:
                log.warning("hostler: %s: %s", key, exc.message)
        return busy

    async def retire(self) -> None:
        """PP9: wait for builds, then evict every engine as its work ends (never cut a request)."""
        self._tasks.refuse_new_work()
        while True:
            up = [k for k, e in self._table.items() if e.up or e.flight]
            if not up:
                return
            for key in up:
                entry = self._table.get(key)
                assert entry is not None  # noqa: S101 - entries are never removed
                if entry.flight is not None:
                    with contextlib.suppress(BaseException):
                        await entry.flight.wait()
                with contextlib.suppress(HostlerError):
                    await self._room.drain(key, None, {"rule": "PP9", "cause": "retire"}, math.inf)

    async def stop_all(self, cause: str) -> None:
        """PP8: stop every engine now, shielded from the caller's cancellation.

        Each stop is recorded when the log takes it, and done all the same when not (SF2).
        """
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as stops:
                for _, entry in self._table.items():
                    stops.start_soon(self._stop_for_close, entry.supervisor, cause)

    async def _stop_for_close(self, supervisor: Supervisor, cause: str) -> None:
        await self._stops.tell(supervisor)
        try:
            await supervisor.stop(cause, unrecorded_ok=True)
        except HostlerError as exc:
            log.error("hostler: %s: %s", supervisor.key, exc.message)  # noqa: TRY400
        if supervisor.pid is not None:
            await supervisor.kill_unrecorded()


class Reconciler:
    """PP10: exactly the named replica counts, evicting the extra and starting the missing.

    Args:
        table: The pool's entries.
        room: Drains an extra replica (PP5).
        starter: Starts a missing one (PP1).
        tasks: The pool's tasks (a closed pool reconciles nothing).
    """

    def __init__(
        self, table: EngineTable, room: RoomDriver, starter: Starter, tasks: PoolTasks
    ) -> None:
        self._table = table
        self._room = room
        self._starter = starter
        self._tasks = tasks

    async def reconcile(self, targets: Mapping[str, int]) -> ReconcileReport:
        """PP10: hold exactly ``targets[model]`` replicas of each named ``engine:model``.

        Replicas at or above the target count are evicted (a busy one drains; one that stays
        busy is reported, left resident); missing replicas ``0..n-1`` are started. Models not
        named are untouched.
        """
        self._tasks.check_open()
        targets = _checked_targets(targets)
        failed: dict[str, str] = {}
        evicted = await self._evict_extra(targets, failed)
        table = self._table
        wanted = {f"{model}:{i}" for model, want in targets.items() for i in range(want)}
        table.protected |= wanted  # the replicas asked for never make room for each other
        started: list[str] = []
        try:
            for model, want in sorted(targets.items()):
                for replica in range(want):
                    key = f"{model}:{replica}"
                    if table.resident(key):
                        continue
                    try:
                        await self._starter.ensure(key, cause="reconcile")
                        started.append(key)
                    except HostlerError as exc:
                        failed[key] = exc.message
                        for later in range(replica + 1, want):  # they would fail the same way
                            failed[f"{model}:{later}"] = f"not tried: {key} could not start"
                        break
        finally:
            table.protected -= wanted
        started = [key for key in started if table.resident(key)]
        return ReconcileReport(tuple(evicted), tuple(started), failed)

    async def _evict_extra(self, targets: Mapping[str, int], failed: dict[str, str]) -> list[str]:
        """The resident replicas at or above their model's target, drained; those evicted."""
        evicted: list[str] = []
        for key in self._table.engine_keys():
            parsed = parse_key(key)
            if parsed is None:
                continue
            want = targets.get(f"{parsed.engine}:{parsed.model}")
            if want is None or parsed.replica < want or not self._table.resident(key):
                continue
            if key in self._table.pinned:
                failed[key] = f"{key} is pinned (PP17): kept resident"
                continue
            try:
                why = {"rule": "PP10", "target": want}
                if await self._room.drain(key, None, why, self._room.drain_wait):
                    evicted.append(key)
            except HostlerError as exc:
                failed[key] = exc.message
        return evicted


def _checked_targets(targets: Mapping[str, int]) -> dict[str, int]:
    """PP10's input at the edge: ``engine:model`` names and counts from 0 to 64."""
    checked: dict[str, int] = {}
    for model, want in targets.items():
        if parse_key(f"{model}:0") is None or model.count(":") != 1:
            raise UsageError(f"reconcile: {str(model)[:80]!r} is not an engine:model name")
        if type(want) is not int or not 0 <= want <= MAX_REPLICAS:
            raise UsageError(
                f"reconcile: {model}: a replica count from 0 to {MAX_REPLICAS}, not {want!r}"[:200]
            )
        checked[model] = want
    return checked
