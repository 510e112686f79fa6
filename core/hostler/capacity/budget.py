"""The host's capacity budget: how many bytes of models may be resident, and where (pure).

Rules B1–B8 of the reference behaviour. The inputs are observations (system RAM, the largest
card's VRAM, whether memory is unified, an operator override); the result is the admission
budget, the fast (accelerator) part, the budget slot counts are sized against, and whether
co-resident models may spill from the card into system RAM by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from hostler.capacity.units import GIB
from hostler.errors import SettingError

__all__ = [
    "MAX_BUDGET_OVERRIDE_GIB",
    "MIN_BUDGET_OVERRIDE_GIB",
    "BudgetKind",
    "CapacityBudget",
    "HostMemory",
    "compute_budget",
    "parse_budget_override",
]

RAM_SHARE_CAP = 96 * GIB
#: B7: the largest operator budget accepted (1 PiB): a bigger figure is a typo, not a host.
MAX_BUDGET_OVERRIDE_GIB = 1_048_576
#: B7: the smallest (about 1 MiB): below it a figure such as ``1e-300`` is a typo, and would be a
#: budget of 0 bytes.
MIN_BUDGET_OVERRIDE_GIB = 0.001
HIGH_MEMORY = 96 * GIB
UNIFIED_FRACTION = 0.70
UNIFIED_FRACTION_HIGH = 0.80
NON_UNIFIED_FRACTION = 0.60
NON_UNIFIED_FRACTION_HIGH = 0.80
UNIFIED_OS_RESERVE_FLOOR = 4 * GIB
UNIFIED_OS_RESERVE_CAP = 16 * GIB
USABLE_VRAM_FRACTION = 0.95
SHARED_POOL_RATIO = 0.75


class BudgetKind(StrEnum):
    """How the host's memory is shaped."""

    UNIFIED = "unified"
    """One pool shared by CPU and GPU (Apple Silicon, GB10, iGPUs)."""
    DISCRETE = "discrete-gpu"
    """A real card: its usable VRAM is added to a share of system RAM."""
    SYSTEM_RAM = "system-ram"
    """No GPU: a share of system RAM only."""


@dataclass(frozen=True, slots=True)
class HostMemory:
    """What a probe observed about the host's memory.

    Attributes:
        system_ram: Total system RAM in bytes.
        vram: The largest card's total memory in bytes; None or 0 when there is no card.
        unified: Whether the probe knows memory is unified; None to infer it.
        apple_silicon: The host is macOS on arm64 (always unified).
    """

    system_ram: int
    vram: int | None = None
    unified: bool | None = None
    apple_silicon: bool = False


@dataclass(frozen=True, slots=True)
class CapacityBudget:
    """The budget derived from one :class:`HostMemory` (all figures in bytes).

    Attributes:
        kind: unified, discrete-gpu or system-ram.
        system_ram: Total system RAM.
        ram_share: The part of system RAM models may use.
        vram: Usable VRAM (95% of the card) on a discrete host, else 0.
        budget: The admission ceiling for everything resident.
        fast: The accelerator part (usable VRAM on discrete hosts, the whole budget otherwise);
            KV caches are sized against it.
        concurrency_sizing: What slot counts are sized against.
        ram_spillover_auto: Whether co-resident models may spill into RAM by default.
        overridden: The operator set the budget (``HOSTLER_CAPACITY_BUDGET_GB``).
    """

    kind: BudgetKind
    system_ram: int
    ram_share: int
    vram: int
    budget: int
    fast: int
    concurrency_sizing: int
    ram_spillover_auto: bool
    overridden: bool = False


def _classify(host: HostMemory) -> BudgetKind:
    has_card = host.vram is not None and host.vram > 0 and math.isfinite(host.vram)
    shared_pool = has_card and (host.vram or 0) >= SHARED_POOL_RATIO * host.system_ram
    unified = host.unified if host.unified is not None else (host.apple_silicon or shared_pool)
    if unified:
        return BudgetKind.UNIFIED
    return BudgetKind.DISCRETE if has_card else BudgetKind.SYSTEM_RAM


def _unified_fraction_share(ram: int) -> int:
    return math.floor(ram * (UNIFIED_FRACTION_HIGH if ram >= HIGH_MEMORY else UNIFIED_FRACTION))


def compute_budget(host: HostMemory, *, override_gib: float | None = None) -> CapacityBudget:
    """Derive the capacity budget of a host (B1–B8).

    Args:
        host: The observed memory.
        override_gib: An operator's total budget in GiB (B7); None, non-positive or
            non-finite values are ignored.
    """
    ram = max(0, int(host.system_ram))
    kind = _classify(host)
    discrete = kind is BudgetKind.DISCRETE
    vram = math.floor((host.vram or 0) * USABLE_VRAM_FRACTION) if discrete else 0
    spillover = not discrete
    if override_gib is not None and math.isfinite(override_gib) and override_gib > 0:
        total = math.floor(override_gib * GIB)
        fast = min(vram, total) if discrete else total
        return CapacityBudget(
            kind=kind,
            system_ram=ram,
            ram_share=max(0, total - vram),
            vram=vram,
            budget=total,
            fast=fast,
            concurrency_sizing=fast,
            ram_spillover_auto=spillover,
            overridden=True,
        )
    if kind is BudgetKind.UNIFIED:
        fraction_share = _unified_fraction_share(ram)
        ram_share = max(
            0,
            min(max(fraction_share, ram - UNIFIED_OS_RESERVE_CAP), ram - UNIFIED_OS_RESERVE_FLOOR),
        )
    else:
        fraction = NON_UNIFIED_FRACTION_HIGH if ram >= HIGH_MEMORY else NON_UNIFIED_FRACTION
        ram_share = min(math.floor(ram * fraction), RAM_SHARE_CAP)
    budget = ram_share + vram
    fast = vram if discrete else budget
    if kind is BudgetKind.UNIFIED:
        pre_cap_curve = min(
            _unified_fraction_share(ram), ram - UNIFIED_OS_RESERVE_FLOOR, RAM_SHARE_CAP
        )
        sizing = min(fast, max(0, pre_cap_curve))
    else:
        sizing = min(fast, vram if discrete else ram_share)
    return CapacityBudget(
        kind=kind,
        system_ram=ram,
        ram_share=ram_share,
        vram=vram,
        budget=budget,
        fast=fast,
        concurrency_sizing=sizing,
        ram_spillover_auto=spillover,
    )


def parse_budget_override(text: str | None) -> float | None:
    """Read ``HOSTLER_CAPACITY_BUDGET_GB``: unset or blank is None, else a GiB figure.

    Raises:
        SettingError: the text is not a number in [MIN_BUDGET_OVERRIDE_GIB,
            MAX_BUDGET_OVERRIDE_GIB]; a typo in a budget must not silently fall back to the
            automatic one, nor become a budget of 0 bytes (B7).
    """
    if text is None or not text.strip():
        return None
    shown = text.strip()[:40]
    try:
        value = float(text.strip())
    except ValueError:
        value = math.nan
    if not MIN_BUDGET_OVERRIDE_GIB <= value <= MAX_BUDGET_OVERRIDE_GIB:  # NaN compares false
        raise SettingError(
            f"HOSTLER_CAPACITY_BUDGET_GB={shown!r}: expected a number of GiB from "
            f"{MIN_BUDGET_OVERRIDE_GIB} to {MAX_BUDGET_OVERRIDE_GIB} (e.g. 24 or 12.5); unset it "
            "for the automatic budget"
        )
    return value
