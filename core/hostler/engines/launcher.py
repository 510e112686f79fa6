"""Where a supervisor's launches come from: one priced launch per start (driver seam).

A supervisor asks its :class:`Launcher` once per start for a :class:`Launch`: the bytes the
ledger is to hold and the spec the engine starts with, made together. The daemon's launcher
(:class:`LedgerLauncher`) prices a configured :class:`~hostler.engines.price.LaunchRequest`
against the host ledger with :func:`~hostler.engines.price.price_from_ledger` — the function
``hostler preview`` calls — so what preview shows, what the pool makes room for, what the ledger
reserves and what is launched are one answer. :class:`FixedLauncher` serves a given spec and
footprint (tests, the plugin harness, an embedding program that prices for itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.measure import load_cpu_limits
from hostler.engines.price import LaunchRequest, PricedLaunch, price_from_ledger
from hostler.plugin import EngineAdapter, LaunchSpec
from hostler.store.log import EventStore

__all__ = ["FixedLauncher", "Launch", "Launcher", "LedgerLauncher"]


class Launch(Protocol):
    """One start's launch: what to reserve and what to start (a :class:`PricedLaunch`)."""

    @property
    def reserved_bytes(self) -> object:
        """The bytes to hold in the ledger (an int; None: nothing to reserve).

        Typed ``object`` because a plugin's footprint may answer junk, which the supervisor
        refuses as the plugin's fault (SG3).
        """
        ...

    def spec(self, port: int) -> LaunchSpec:
        """The launch spec on ``port``."""
        ...


class Launcher(Protocol):
    """Makes one start's :class:`Launch` (blocking: pricing reads files and the ledger)."""

    def price(self) -> Launch:
        """The launch of the next start, priced now."""
        ...


class LedgerLauncher:
    """A configured engine's launches, priced against the host ledger (the daemon's).

    Args:
        adapter: The engine's adapter.
        ledger: The host ledger whose budget, residents and learning price the launch.
        request: What the operator configured for the engine.
        limits: The log whose ``cpu.unsupported`` say what builds cannot run here (L22).
    """

    def __init__(
        self,
        adapter: EngineAdapter,
        ledger: HostLedger,
        request: LaunchRequest,
        *,
        limits: EventStore | None = None,
    ) -> None:
        self._adapter = adapter
        self._ledger = ledger
        self._limits = limits
        self.request = request

    def price(self) -> PricedLaunch:
        """:func:`~hostler.engines.price.price_from_ledger` of the request, now."""
        limits = None if self._limits is None else load_cpu_limits(self._limits)
        return price_from_ledger(self._adapter, self._ledger, self.request, cpu_limits=limits)


class _FixedLaunch:
    def __init__(self, spec: Callable[[int], LaunchSpec], reserved: object) -> None:
        self._spec = spec
        self._reserved = reserved

    @property
    def reserved_bytes(self) -> object:
        return self._reserved

    def spec(self, port: int) -> LaunchSpec:
        return self._spec(port)


class FixedLauncher:
    """Launches from a given spec function and footprint (None: nothing is reserved).

    Args:
        spec: The launch spec for a port.
        footprint: The bytes to reserve, asked once per start (None: no reservation).
    """

    def __init__(
        self, spec: Callable[[int], LaunchSpec], footprint: Callable[[], object] | None = None
    ) -> None:
        self._spec = spec
        self._footprint = footprint

    def price(self) -> Launch:
        """The footprint asked now, with the spec function."""
        footprint = self._footprint
        return _FixedLaunch(self._spec, None if footprint is None else footprint())
