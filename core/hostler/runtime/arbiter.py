"""The GPU arbiter (anyio driver): which workload slot may use the card, and when.

It executes what the pure arbiter policy (:mod:`hostler.policies.arbiter`) decides: in
``swap`` mode one slot at a time holds the card — a plain :meth:`GpuArbiter.acquire` waits
while another slot holds the exclusive lease, a :meth:`GpuArbiter.lease` waits while any lease
is held — and the other slots' engines are evicted (through their registered evictors) before
the work runs; in ``coexist`` mode nothing waits and nothing is evicted. Either way the device
health gate (:class:`~hostler.runtime.health.DeviceHealthGate`) has the last word.

Each exclusive lease is a :class:`~hostler.machines.lease.Lease` recorded in its own stream
``lease/<id>`` (requested, granted, released or broken). Waiters look again when woken and on a
re-check timer, so a lease leaked by a holder that never released is broken once it is older
than the 90-minute ceiling (GA4) and the waiters proceed.

Rules (docs/rules.md): GA1–GA7.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio

from hostler.clock import ClockLike, as_clock
from hostler.drivers.offloop import OffLoop
from hostler.errors import StoreError, UsageError
from hostler.events.base import Event
from hostler.machines.lease import Lease, LeaseState
from hostler.policies.arbiter import (
    SLOTS,
    STALE_LEASE_CEILING,
    HeldLease,
    Mode,
    Pressure,
    acquire_waits,
    gpu_pressure,
    lease_verdict,
    recheck_interval,
    resolve_policy,
)
from hostler.runtime.health import DeviceHealthGate
from hostler.store.log import EventStore

__all__ = ["DEFAULT_OWNER", "GpuArbiter", "Release"]

log = logging.getLogger(__name__)

Evictor = Callable[[], Awaitable[None]]
#: Releases what an acquire took; idempotent (a second call does nothing).
Release = Callable[[], Awaitable[None]]
#: GA1: the owner an evictor is registered under when none is named.
DEFAULT_OWNER = "default"
#: How many recorded events an arbiter without a store keeps (for status and tests).
_HISTORY = 256


async def _no_release() -> None:
    """The release of a coexist acquire: nothing was held."""


@dataclass
class _Holder:
    """The exclusive lease now held: its recorded model and the policy's view of it."""

    lease: Lease
    held: HeldLease


class GpuArbiter:
    """Shares the card between the ``llm``, ``image`` and ``video`` slots (GA1–GA7).

    Args:
        policy: ``swap``, ``coexist`` or ``auto`` (GA7: auto means coexist).
        health_gate: Runs last on every acquire (None: no gate).
        clock: The clock: wall time for the lease records and the leak ceiling, timeouts for
            the re-check.
        store: Where lease events are recorded (stream ``lease/<id>``); without one they are
            kept in :attr:`history` only.
        ceiling: GA4's leak ceiling (seconds).
        recheck_every: How often a waiter looks again unwoken (default GA3's
            min(60 s, ceiling)).
        io: Runs the store's blocking appends off the event loop.

    Raises:
        UsageError: ``policy`` is not swap, coexist or auto.
    """

    def __init__(
        self,
        policy: str = "auto",
        *,
        health_gate: DeviceHealthGate | None = None,
        clock: ClockLike = time.time,
        store: EventStore | None = None,
        ceiling: float = STALE_LEASE_CEILING,
        recheck_every: float | None = None,
        io: OffLoop | None = None,
    ) -> None:
        self._mode: Mode = _resolve(policy)
        self.health_gate = health_gate
        self._clock = as_clock(clock)
        self._store = store
        self._io = io or OffLoop(threads=1)
        self.ceiling = ceiling
        self.recheck_every = recheck_interval(ceiling) if recheck_every is None else recheck_every
        self._evictors: dict[str, dict[str, Evictor]] = {}
        self._holder: _Holder | None = None
        self._waiting: dict[str, Lease] = {}
        self._wake = anyio.Event()
        self._writing = anyio.Lock()
        self.history: deque[tuple[str, Event]] = deque(maxlen=_HISTORY)

    # -- policy (GA5, GA7) -------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The policy in force: ``swap`` or ``coexist``."""
        return self._mode

    def set_policy(self, policy: str) -> None:
        """GA5: switch the policy live; to coexist wakes every waiter. Loads or evicts nothing.

        Raises:
            UsageError: ``policy`` is not swap, coexist or auto.
        """
        mode = _resolve(policy)
        if mode == self._mode:
            return
        log.info("hostler: GPU policy %s -> %s", self._mode, mode)
        self._mode = mode
        if mode == "coexist":
            self._notify()

    # -- evictors (GA1) ----------------------------------------------------------------------

    def register_evictor(self, slot: str, evict: Evictor, owner: str = DEFAULT_OWNER) -> None:
        """GA1: ``evict`` frees the card of ``owner``'s ``slot`` work; replaces the same pair's."""
        self._evictors.setdefault(_slot(slot), {})[owner] = evict

    def unregister_evictor(self, slot: str, owner: str = DEFAULT_OWNER) -> None:
        """GA1: forget one owner's evictor (the slot goes once it has none); unknown: no-op."""
        owners = self._evictors.get(_slot(slot))
        if owners is None:
            return
        owners.pop(owner, None)
        if not owners:
            del self._evictors[slot]

    def evictors(self) -> dict[str, list[str]]:
        """The owners registered per slot, sorted (for status)."""
        return {slot: sorted(owners) for slot, owners in sorted(self._evictors.items())}

    async def _evict_others(self, slot: str) -> None:
        """GA2: every owner of every other slot, one at a time; failures are logged only."""
        for other, owners in list(self._evictors.items()):
            if other == slot:
                continue
            for owner, evict in list(owners.items()):
                try:
                    await evict()
                except Exception:
                    log.exception(
                        "hostler: evicting %s work of %r for %s failed; going on",
                        other,
                        owner,
                        slot,
                    )

    # -- acquire (GA2) -----------------------------------------------------------------------

    async def acquire(self, slot: str) -> None:
        """GA2: make way for ``slot``'s work.

        In swap mode: wait while another slot holds the lease, then evict the other slots.
        In both modes the health gate runs last (its refusal propagates).

        Raises:
            UsageError: ``slot`` is not a GA1 slot.
            DeviceUnhealthyError: The health gate held the work past its max wait.
        """
        slot = _slot(slot)
        while acquire_waits(slot, self._held(), self._mode):
            if not await self._break_if_stale(slot):
                log.info("hostler: %s work waits for the %s lease", slot, self._held_slot())
                await self._wait()
        if self._mode == "swap":
            await self._evict_others(slot)
        await self._admit(slot)

    # -- leases (GA3, GA4) -------------------------------------------------------------------

    async def acquire_lease(self, slot: str, holder: str = DEFAULT_OWNER) -> Release:
        """GA3: the card for ``slot`` alone until the returned (idempotent) release is awaited.

        As :meth:`acquire_lease_with_id`, without the lease's id.
        """
        _lease_id, release = await self.acquire_lease_with_id(slot, holder)
        return release

    async def acquire_lease_with_id(
        self, slot: str, holder: str = DEFAULT_OWNER
    ) -> tuple[str | None, Release]:
        """GA3: the card for ``slot`` alone until the returned (idempotent) release is awaited.

        Returns the lease's id (as :meth:`leases` lists it; None in coexist mode, where no
        lease is taken) and its release.

        Coexist mode (or a switch to it while waiting): the health gate, then a no-op release.
        Swap mode: wait while any lease is held (breaking a leaked one, GA4), take the lease,
        evict the other slots, run the health gate; a failure there releases the lease again.

        Raises:
            UsageError: ``slot`` is not a GA1 slot.
            DeviceUnhealthyError: The health gate held the work past its max wait.
        """
        slot = _slot(slot)
        if self._mode == "coexist":
            await self._admit(slot)
            return None, _no_release
        lease = Lease(secrets.token_hex(8))
        lease.fire("request", slot=slot, holder=holder, at=self._clock.wall())
        self._waiting[lease.key] = lease
        try:
            await self._record(lease)
            while True:
                verdict = lease_verdict(
                    slot, self._held(), self._mode, self._clock.wall(), self.ceiling
                )
                if verdict.action == "take":
                    break
                if verdict.action == "free":
                    await self._end_waiting(lease, "policy switched to coexist")
                    await self._admit(slot)
                    return None, _no_release
                if verdict.action == "break":
                    await self._break(verdict.decision)
                    continue
                log.info(
                    "hostler: %s lease for %r waits for the %s lease",
                    slot,
                    holder,
                    self._held_slot(),
                )
                await self._wait()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._end_waiting(lease, "gave up waiting")
            raise
        del self._waiting[lease.key]
        now = self._clock.wall()
        lease.fire("grant", at=now, expires_at=now + self.ceiling)
        holding = self._holder = _Holder(lease, HeldLease(slot, now))
        released = False

        async def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            await self._release(holding, "released")

        try:
            await self._record(lease)
            await self._evict_others(slot)
            await self._admit(slot)
        except BaseException as exc:
            released = True
            with anyio.CancelScope(shield=True):
                await self._release(holding, f"failed: {exc!r}"[:200])
            raise
        return lease.key, release

    @asynccontextmanager
    async def lease(self, slot: str, holder: str = DEFAULT_OWNER) -> AsyncIterator[None]:
        """GA3 as a context manager: ``async with arbiter.lease("image", "job-7"): ...``."""
        release = await self.acquire_lease(slot, holder)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await release()

    def recheck(self) -> None:
        """Wake every waiter to look again now (what the re-check timer does)."""
        self._notify()

    def leases(self) -> list[dict[str, Any]]:
        """The held lease and the waiting requests, for status (held first)."""
        now = self._clock.wall()
        rows = []
        models = ([self._holder.lease] if self._holder else []) + list(self._waiting.values())
        for model in models:
            rows.append(
                {
                    "id": model.key,
                    "slot": model.slot,
                    "holder": model.holder,
                    "state": model.state,
                    "since": model.granted_at
                    if model.state == LeaseState.HELD
                    else model.changed_at,
                    "held_for": None
                    if model.granted_at is None
                    else round(max(now - model.granted_at, 0.0), 3),
                    "expires_at": model.expires_at,
                }
            )
        return rows

    async def pressure(self) -> Pressure:
        """GA6: memory pressure from the health gate's GPU readings (at most 1 s old)."""
        if self.health_gate is None:
            return gpu_pressure(())
        status = await self.health_gate.status(max_age=1.0)
        return gpu_pressure(
            (r.total_mib, r.used_mib)
            for r in status.readings
            if r.total_mib is not None and r.used_mib is not None
        )

    # -- internals ---------------------------------------------------------------------------

    def _held(self) -> HeldLease | None:
        return None if self._holder is None else self._holder.held

    def _held_slot(self) -> str:
        return "none" if self._holder is None else self._holder.held.slot

    def _notify(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()

    async def _wait(self) -> None:
        """Until woken (a release, a break, a policy switch) or the re-check timer fires."""
        with self._clock.move_on_after(self.recheck_every):
            await self._wake.wait()

    async def _admit(self, slot: str) -> None:
        if self.health_gate is not None:
            await self.health_gate.admit(f"{slot} workload")

    async def _break_if_stale(self, slot: str) -> bool:
        verdict = lease_verdict(slot, self._held(), "swap", self._clock.wall(), self.ceiling)
        if verdict.action != "break":
            return False
        await self._break(verdict.decision)
        return True

    async def _break(self, decision: dict[str, Any]) -> None:
        """GA4: the held lease is a leak: record the break, clear it, wake every waiter."""
        holding = self._holder
        if holding is None:  # pragma: no cover - the verdict saw a holder
            return
        now = self._clock.wall()
        expires = holding.lease.expires_at or now
        log.error(
            "hostler: the %s lease of %r was held %.0f s, past the %.0f s ceiling: a leak; "
            "breaking it",
            holding.held.slot,
            holding.lease.holder,
            decision["held_for"],
            self.ceiling,
        )
        holding.lease.fire(
            "expire",
            at=now,
            reason=f"held {decision['held_for']:.0f} s, past the {self.ceiling:.0f} s ceiling",
            stale_for=round(max(now - expires, 0.0), 3),
        )
        self._holder = None
        self._notify()
        holding.lease.unbind()
        await self._record(holding.lease)

    async def _release(self, holding: _Holder, cause: str) -> None:
        """GA3: clear the lease if it is still this one (a broken one is not touched)."""
        if self._holder is not holding:
            return
        holding.lease.fire("release", at=self._clock.wall(), cause=cause)
        self._holder = None
        self._notify()
        holding.lease.unbind()
        await self._record(holding.lease)

    async def _end_waiting(self, lease: Lease, cause: str) -> None:
        if self._waiting.pop(lease.key, None) is None:
            return
        lease.fire("release", at=self._clock.wall(), cause=cause)
        lease.unbind()
        await self._record(lease)

    async def _record(self, lease: Lease) -> None:
        """Write the lease's pending events (one write at a time; a failing store is logged)."""
        async with self._writing:
            events = list(lease.pending)
            if not events:
                return
            if self._store is not None:
                try:
                    await self._io.run(self._append, lease, events)
                except StoreError as exc:
                    log.warning("hostler: lease %s not recorded: %s", lease.key, exc)
                    return
            else:
                del lease.pending[: len(events)]
            self.history.extend((lease.stream_id, e) for e in events)

    def _append(self, lease: Lease, events: list[Any]) -> None:
        assert self._store is not None  # noqa: S101 - only called with a store
        result = self._store.append(
            lease.stream_id,
            events,
            expected_version=lease.version,
            metadata={"actor": "gpu-arbiter"},
        )
        lease.version = result.version
        del lease.pending[: len(events)]


def _resolve(policy: str) -> Mode:
    try:
        return resolve_policy(policy)
    except ValueError as exc:
        raise UsageError(f"GPU arbiter: {exc}") from exc


def _slot(slot: str) -> str:
    if slot not in SLOTS:
        raise UsageError(f"GPU slot {slot!r} is not one of {', '.join(SLOTS)}")
    return slot
