"""Real ``llama-server`` engines of tiny generated models, for runtime and HTTP-face tests."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import hostler
from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.price import LaunchRequest, price_from_ledger
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.plugin import LaunchSpec
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter

GIB = 2**30


class LlamaRig:
    """Tiny models, one log, one ledger whose budget (``budget_gib``) a test may set later."""

    def __init__(self, tmp_path: Path, store: EventStore, names: Iterable[str]) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.models = {name: write_tiny_llama(tmp_path / f"{name}.gguf") for name in names}
        self.budget_gib: float | None = None
        self.ledger = HostLedger(
            store,
            OwnerIdentity.current("llamatest"),
            lambda: compute_budget(HostMemory(64 * GIB), override_gib=self.budget_gib),
        )
        self.adapter = LlamaCppAdapter()
        self.token = f"llamatest-{os.getpid()}-{tmp_path.name}"

    def price(self, key: str) -> int:
        """What the ledger would hold for ``key`` now (one slot of 512 tokens)."""
        name = key.split(":")[1]
        priced = price_from_ledger(
            self.adapter,
            self.ledger,
            LaunchRequest(key=key, model=self.models[name], ctx=512, slots=1, kv_type=None),
        ).price
        return int(priced.reserved_bytes)

    def build(self, key: str) -> Supervisor:
        """The supervisor of ``llamacpp:NAME:0``."""
        name = key.split(":")[1]
        run = self.tmp_path / "run" / name
        return Supervisor(
            key,
            self.adapter,
            lambda port: LaunchSpec(
                key, self.models[name], port, ctx_per_slot=512, slots=1, work_dir=run / "work"
            ),
            self.store,
            run_dir=run,
            token_prefix=self.token,
            policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=0),
            ledger=self.ledger,
            footprint=lambda: self.price(key),
        )

    def runtime(self) -> hostler.Runtime:
        """A runtime over these engines (drain checks every 50 ms, 30 s bound)."""
        return hostler.Runtime(
            self.store,
            self.build,
            ledger=self.ledger,
            drain_poll=0.05,
            drain_wait=30,
        )


def room_for(engines: int, price: int, measured: int) -> int:
    """A budget (bytes) with room for ``engines`` engines of one size, never for one more.

    A first start reserves its ``price``; a running engine holds what was ``measured``, and a
    later start of a measured engine reserves about that (its price is learned, PR1). So
    ``engines`` fit even when the last of them starts for the first time ((engines - 1) ×
    measured + price), and one more never fits ((engines + 1) × measured): the budget is the
    midpoint. The ratio of price to footprint differs between llama-server builds (the
    PyPI wheel maps more libraries than a build from source), so a test sizes its budget from
    both, never from a multiple of one.
    """
    low, high = (engines - 1) * measured + price, (engines + 1) * measured
    if not low < high:
        raise AssertionError(
            f"a price of {price} B is two footprints ({measured} B) or more: no budget holds "
            f"{engines} engines and never {engines + 1}"
        )
    return (low + high) // 2
