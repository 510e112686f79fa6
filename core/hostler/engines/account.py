"""One engine's account in the host ledger: reserve before a start, bind, learn, release.

The ledger (:class:`~hostler.drivers.host_ledger.HostLedger`) decides; this is the engine's
side of it, carried out off the event loop:

- before a start, the priced launch's bytes are **reserved** (a refusal is the ledger's,
  recorded there with its inputs: :class:`~hostler.errors.CapacityDeniedError`);
- once spawned, the reservation is **bound** to the process (pid and start time: OW2);
- once ready, the engine is **measured** (RAM and GPU) and the ledger holds the truth, the
  launch's facts teaching later estimates (CB6);
- when no process holds it any more, it is **released**, or left owed and retried (OW7).

Without a ledger (a test, an embedding that does no accounting) every step does nothing.
"""

from __future__ import annotations

import contextlib
import logging

import psutil

from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.measure import LaunchFacts, record_launch
from hostler.drivers.offloop import OffLoop
from hostler.engines.guard import AdapterGuard
from hostler.engines.launcher import Launch
from hostler.engines.process import ProcessIdentity
from hostler.errors import CapacityDeniedError, HostlerError, StoreError
from hostler.plugin import LaunchSpec
from hostler.pluginhost import answer_problem
from hostler.probes.nvml import NvmlProbe
from hostler.probes.process import measure_process

__all__ = ["EngineAccount"]

log = logging.getLogger(__name__)


class EngineAccount:
    """The ledger's side of one engine key.

    Args:
        key: The engine key.
        ledger: The host ledger (None: no accounting).
        guard: Its adapter, asked safely (the model's identity, a byte count's check).
        offloop: Where the ledger's writes run.
        probe: NVML, so that measured footprints include GPU memory.
    """

    def __init__(
        self,
        key: str,
        ledger: HostLedger | None,
        guard: AdapterGuard,
        offloop: OffLoop,
        probe: NvmlProbe | None,
    ) -> None:
        self.key = key
        self.ledger = ledger
        self._guard = guard
        self._io = offloop
        self._probe = probe

    async def reserve(self, token: str, launch: Launch) -> int | None:
        """Hold the launch's bytes before it starts; what the ledger holds (None: no accounting).

        Raises:
            CapacityDeniedError: The ledger refused (recorded there).
            PluginError: The launch's price is no byte count (NaN, None, True, -5).
        """
        raw: object = launch.reserved_bytes
        ledger = self.ledger
        if ledger is None or raw is None:
            return None
        problem = answer_problem(raw, int)
        if problem is None and isinstance(raw, int) and raw < 0:
            problem = f"returned {raw}"
        if problem is not None or not isinstance(raw, int):
            raise self._guard.fault(f"{problem} from estimate_footprint, not a byte count")
        estimate = raw
        decision = await self._io.run_patiently(
            lambda: ledger.reserve(self.key, estimate, token=token)
        )
        if not decision.granted:
            raise CapacityDeniedError(f"{self.key}: {decision.reason}")
        return estimate

    async def bind(self, identity: ProcessIdentity) -> None:
        """OW2: the reservation names its process now (unrecorded, its launch token still does)."""
        ledger = self.ledger
        if ledger is None:
            return
        try:
            await self._io.run_patiently(
                lambda: ledger.bind(
                    self.key, identity.pid, identity.create_time, identity.since_boot
                )
            )
        except StoreError as exc:
            # the reservation still names the launch token, which finds the engine (OW2)
            log.warning("hostler: %s: ledger bind not recorded (%s)", self.key, exc.message)

    async def release(self, cause: str = "released") -> None:
        """Give the reservation back, or leave it owed and retried (OW7), never dropped."""
        ledger = self.ledger
        if ledger is not None:
            await self._io.run(lambda: ledger.release_or_owe(self.key, cause=cause))

    async def learn(self, spec: LaunchSpec, pid: int, estimate: int, build: str) -> None:
        """Measure the ready engine (RAM and GPU); the ledger holds the truth, estimates learn.

        Priced at nothing, it is only measured: the ledger must still hold what it uses.
        """
        ledger, probe = self.ledger, self._probe
        if ledger is None:
            return
        if not estimate:
            with contextlib.suppress(HostlerError, psutil.Error, OSError):
                await self._io.run(
                    lambda: ledger.record_measured(self.key, measure_process(pid, probe).total)
                )
            return
        model: object = spec.model.name
        adapter = self._guard.adapter
        with contextlib.suppress(HostlerError):  # a raising plugin costs the lesson, not the start
            model = self._guard.ask(
                "model_identity", adapter.model_identity, spec.model, returns=str
            )
        facts = LaunchFacts(
            engine_key=self.key,
            model=str(model),
            build=build,
            kv_type=spec.kv_type or "f16",
            ctx_total=spec.ctx_per_slot * spec.slots,
            slots=spec.slots,
            estimated=estimate,
        )
        with contextlib.suppress(HostlerError, psutil.Error):
            await self._io.run(lambda: record_launch(ledger, facts, pid, probe=probe))
