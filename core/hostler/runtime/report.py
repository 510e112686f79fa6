"""What the runtime shows of its engines: status, ``ps`` details, launches, device health.

:class:`EngineReport` only looks (peeks: it never builds an engine and never counts as use):
the pool's snapshot (PP16) with the sessions bound to each engine and the ledger as last
folded; per engine when it entered its state and why, its idle deadline, reserved and
measured bytes and the GPU lease; how each running engine was launched; the device health
gate's status (DH5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.offloop import OffLoop
from hostler.errors import StoreError
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.details import EngineBytes, LedgerFold, last_reason
from hostler.runtime.health import DeviceHealthGate, HealthStatus
from hostler.runtime.pool import Pool
from hostler.runtime.router import Router
from hostler.runtime.table import EntryView
from hostler.store.log import EventStore

__all__ = ["EngineReport", "LaunchSummary", "RuntimeStatus"]


@dataclass(frozen=True, slots=True)
class LaunchSummary:
    """How a running engine was launched: its process, port and plan (safe facts only)."""

    key: str
    pid: int | None
    port: int | None
    ctx_per_slot: int | None
    slots: int | None
    kv_type: str | None


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    """A status snapshot that builds nothing and touches nothing (a peek).

    Attributes:
        engines: Every engine the runtime knows (PP16).
        sessions: Bound sessions per engine key.
        ledger: The host ledger's budget, limits and reservations (CB10), or None without one.
        closed: Whether the runtime takes no new work.
    """

    engines: tuple[EntryView, ...]
    sessions: Mapping[str, int]
    ledger: Mapping[str, Any] | None
    closed: bool


class EngineReport:
    """The runtime's engines as status, ``hostler ps`` and the operator's face show them.

    Args:
        pool: The runtime's engines.
        router: The sessions bound to them.
        ledger: The host ledger (None: no accounting).
        arbiter: The GPU arbiter (the lease held now, the device health gate).
        store: The runtime's event log (why each engine is in its state).
        offloop: Where the logs are read.
    """

    def __init__(
        self,
        pool: Pool,
        router: Router,
        ledger: HostLedger | None,
        *,
        arbiter: GpuArbiter,
        store: EventStore,
        offloop: OffLoop,
    ) -> None:
        self._pool = pool
        self._router = router
        self._ledger = ledger
        self._arbiter = arbiter
        self._store = store
        self._io = offloop
        self._ledger_fold: LedgerFold | None = None  # reserved vs measured bytes, for ps

    def status(self) -> RuntimeStatus:
        """Every engine, the sessions bound to each, and the ledger as last folded."""
        ledger = None
        if self._ledger is not None:
            state = self._ledger.state
            ledger = {
                "committed": state.committed,
                "explicit_budget": state.explicit_budget,
                "spillover": state.spillover,
            }
        return RuntimeStatus(
            tuple(self._pool.snapshot()),
            dict(self._router.session_counts()),
            ledger,
            self._pool.closed,
        )

    def engine_status(self, key: str) -> EntryView | None:
        """One engine's snapshot, or None when the runtime does not know it."""
        return next((v for v in self._pool.snapshot() if v.key == key), None)

    async def engine_details(self) -> dict[str, dict[str, Any]]:
        """What ``hostler ps`` shows beyond :meth:`status`, per engine key (builds nothing).

        ``state_since`` (when it entered its state), ``idle_deadline`` (when the idle timeout
        stops it if nothing uses it; None when not running, pinned or never idle-stopped),
        ``last_reason`` (why it is in its state, from its latest lifecycle event),
        ``reserved_bytes`` and ``measured_bytes`` (what its reservation was admitted with and
        its measured footprint once ready; None without one), ``lease`` (the GPU lease held
        now: ``{"slot", "holder"}``, or None), ``slots`` (how many requests it was launched to
        serve at once, its ``--parallel``; None when no process runs). The logs are read off
        the event loop.
        """
        pinned = self._pool.pinned
        facts: dict[str, dict[str, Any]] = {}
        for key in self._pool.engine_keys():
            sup = self._pool.supervisor(key)
            timeout = sup.rules.idle_timeout
            idle = sup.state == "running" and timeout > 0 and key not in pinned
            spec = sup.launch_spec
            facts[key] = {
                "state_since": sup.engine.changed_at,
                "idle_deadline": sup.last_used + timeout if idle else None,
                "slots": spec.slots if spec is not None and sup.pid is not None else None,
            }
        held = next((row for row in self._arbiter.leases() if row["state"] == "held"), None)
        lease = None if held is None else {"slot": held["slot"], "holder": held["holder"]}
        ledger = self._ledger
        if ledger is not None and self._ledger_fold is None:
            self._ledger_fold = LedgerFold(ledger.owner)
        fold, store = self._ledger_fold, self._store

        def read() -> tuple[dict[str, str | None], dict[str, EngineBytes]]:
            try:
                reasons = {key: last_reason(store, key) for key in facts}
            except StoreError:  # the log is away (a stopped server): the reasons are unknown
                reasons = {}
            held = {} if fold is None or ledger is None else fold.read(ledger.store)
            return reasons, held

        reasons, held_bytes = await self._io.run(read)
        for key, row in facts.items():
            bytes_ = held_bytes.get(key)
            row["last_reason"] = reasons.get(key)
            row["reserved_bytes"] = None if bytes_ is None else bytes_.reserved
            row["measured_bytes"] = None if bytes_ is None else bytes_.measured
            row["lease"] = lease
        return facts

    def launch_summaries(self) -> list[LaunchSummary]:
        """How each running engine was launched."""
        found = []
        for key in self._pool.engine_keys():
            sup = self._pool.supervisor(key)
            spec = sup.launch_spec
            if sup.pid is None:
                continue
            found.append(
                LaunchSummary(
                    key,
                    sup.pid,
                    sup.port,
                    spec.ctx_per_slot if spec else None,
                    spec.slots if spec else None,
                    spec.kv_type if spec else None,
                )
            )
        return found

    def request_model(self, key: str) -> str | None:
        """RD10: the ``model`` field ``key``'s engine must be sent (None: the client's stands)."""
        return self._pool.supervisor(key).adapter.request_model

    async def device_health(self) -> HealthStatus | None:
        """The device health gate's status (DH5), or None when no gate is configured."""
        gate: DeviceHealthGate | None = self._arbiter.health_gate
        return None if gate is None else await gate.status()
