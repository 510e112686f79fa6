"""ds4's launch and pricing rules, pure (no I/O, no clock): D2, D5–D8, D10, SV10a.

Every figure is bytes unless its name says otherwise (``_gib``, ``_mb``, tokens). The adapter
(:mod:`hostler_ds4.adapter`) gathers the inputs — the host's RAM and machine, the model file's
size, the operator's settings — and turns these results into ``ds4-server`` flags and a
footprint; nothing here reads a file, the environment or the clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "DEFAULT_KV_DISK_MB",
    "FULL_RESIDENCY_FLOOR",
    "GIB",
    "HIGH_RAM_TIER",
    "HIGH_RAM_TIER_AT",
    "LOW_RAM_TIER",
    "NO_STREAMING_HEADROOM",
    "SAFE_CACHE_HEADROOM",
    "STREAMED_FALLBACK_CAP",
    "ExpertCache",
    "Residency",
    "ResidentLine",
    "cache_fallback_gib",
    "exited_before_ready",
    "expert_cache",
    "footprint",
    "kv_disk_mb",
    "launch_context",
    "ram_tier",
    "residency",
    "resident_line",
]

GIB = 1024**3

#: D5: the launch context of a host with at least :data:`HIGH_RAM_TIER_AT` of RAM, else the low.
HIGH_RAM_TIER = 262_144
LOW_RAM_TIER = 131_072
HIGH_RAM_TIER_AT = 192 * GIB
#: D7: "no streaming" is honoured only when the model plus this much fits in system RAM.
NO_STREAMING_HEADROOM = 32 * GIB
#: D7: a fully resident ds4 reserves at least this much (it monopolises the ledger).
FULL_RESIDENCY_FLOOR = 96 * GIB
#: D8: RAM left to the system beside the fixed part and the expert cache.
SAFE_CACHE_HEADROOM = 32 * GIB
#: D10 (CB11): without catalog figures a streamed model is priced at its size, at most this.
STREAMED_FALLBACK_CAP = 48 * GIB
#: D2, IN37: the disk KV budget (MiB) unless the operator sets one.
DEFAULT_KV_DISK_MB = 16_384

#: The machines "no streaming" may be honoured on (D7: arm64, macOS or Linux).
_ARM64 = frozenset({"arm64", "aarch64"})
#: What a ds4-server prints when its single-instance lock is held (D4, IN4).
_LOCK_REFUSAL = re.compile(r"another (ds4-server )?instance|single-instance lock", re.IGNORECASE)


def ram_tier(system_ram: int) -> int:
    """D5: the launch context the host's RAM affords (262,144 from 192 GiB, else 131,072)."""
    return HIGH_RAM_TIER if system_ram >= HIGH_RAM_TIER_AT else LOW_RAM_TIER


def launch_context(
    system_ram: int,
    *,
    floor: int,
    configured: int | None = None,
    override: int | None = None,
    catalog_max: int | None = None,
) -> int:
    """D5: the ``--ctx`` a ds4 launch gets.

    ``override`` is a per-model window (it lowers the floor when below it, C4); ``configured``
    an engine-wide one (the floor still holds); otherwise the RAM tier, capped by the model's
    ``catalog_max`` (its largest servable launch context). A ``catalog_max`` below the floor
    wins over everything: the engine cannot serve more.

    Raises:
        ValueError: A window, floor or cap that is not a positive number of tokens.
    """
    for name, value in (
        ("floor", floor),
        ("configured", configured),
        ("override", override),
        ("catalog_max", catalog_max),
    ):
        if value is not None and value <= 0:
            raise ValueError(f"ds4 {name} window must be a positive number of tokens, not {value}")
    if override is not None:
        floor = min(floor, override)
        resolved = override
    elif configured is not None:
        resolved = configured
    else:
        tier = ram_tier(system_ram)
        resolved = tier if catalog_max is None else min(tier, catalog_max)
    if catalog_max is not None and catalog_max < floor:
        return catalog_max
    return max(floor, resolved)


@dataclass(frozen=True, slots=True)
class ResidentLine:
    """D6: what a launch holds as a line in its context: ``context_free + per_token × ctx``."""

    context_free: int
    per_token: int

    def at(self, ctx: int) -> int:
        """The projected resident bytes at a launch context of ``ctx`` tokens (rounded)."""
        return round(self.context_free + self.per_token * ctx)


def resident_line(
    resident_bytes: int | None, per_token: int | None, resident_ctx: int | None
) -> ResidentLine | None:
    """D6: the catalog's resident figure re-based to any context; None unless all three exist.

    ``resident_bytes`` was measured at ``resident_ctx`` tokens, with ``per_token`` bytes of KV
    per token; the part that does not grow with the context is never negative.
    """
    if resident_bytes is None or per_token is None or resident_ctx is None:
        return None
    return ResidentLine(max(0, resident_bytes - per_token * resident_ctx), per_token)


class Residency(StrEnum):
    """D7: how a ds4 model lives in memory."""

    STREAMING = "ssd-streaming"
    FULL = "full"


def residency(
    *, want_streaming: bool, machine: str, model_size: int | None, system_ram: int
) -> Residency:
    """D7: SSD streaming unless "no streaming" is asked for AND safe.

    Safe means an arm64 host (macOS or Linux) and a known model size with
    ``size + 32 GiB <= system RAM`` (IN36: a 153 GB model fully resident on a 128 GB Mac
    locked the machine up).
    """
    if want_streaming:
        return Residency.STREAMING
    if machine.lower() not in _ARM64 or model_size is None or model_size < 0:
        return Residency.STREAMING
    if model_size + NO_STREAMING_HEADROOM <= system_ram:
        return Residency.FULL
    return Residency.STREAMING


@dataclass(frozen=True, slots=True)
class ExpertCache:
    """D8: the SSD-streaming expert cache (``--ssd-streaming-cache-experts <gib>GB``).

    Attributes:
        gib: The cache size in GiB (at least 1).
        requested_gib: What was asked for (the operator, the catalog, or the RAM fallback).
        safe_gib: The most the host can spare, ``floor((RAM - fixed - 32 GiB) / GiB)``.
        clamped: The request was cut to ``safe_gib``.
        unsafe: Not even 1 GiB is safe: a streaming launch is refused.
    """

    gib: int
    requested_gib: int
    safe_gib: int
    clamped: bool
    unsafe: bool


def cache_fallback_gib(system_ram: int) -> int:
    """D8: the expert cache without any setting: 64 GiB from 120 GiB of RAM, 48 from 88, else 32."""
    if system_ram >= 120 * GIB:
        return 64
    if system_ram >= 88 * GIB:
        return 48
    return 32


def expert_cache(
    system_ram: int,
    *,
    configured_gib: int | None = None,
    catalog_resident: int | None = None,
    catalog_cache: int | None = None,
) -> ExpertCache:
    """D8: size the expert cache; ``unsafe`` when the host cannot spare even 1 GiB.

    The fixed part is ``max(0, catalog_resident - catalog_cache)`` (what stays resident beside
    the cache; 0 when the catalog does not say). The request is the operator's, else the
    catalog's cache in whole GiB, else :func:`cache_fallback_gib`.

    Raises:
        ValueError: A configured size below 1 GiB.
    """
    if configured_gib is not None and configured_gib < 1:
        raise ValueError(f"ds4 expert cache must be at least 1 GiB, not {configured_gib}")
    fixed = 0
    if catalog_resident is not None and catalog_cache is not None:
        fixed = max(0, catalog_resident - catalog_cache)
    if configured_gib is not None:
        requested = configured_gib
    elif catalog_cache is not None:
        requested = catalog_cache // GIB
    else:
        requested = cache_fallback_gib(system_ram)
    safe = (system_ram - fixed - SAFE_CACHE_HEADROOM) // GIB
    if safe < 1:
        return ExpertCache(1, requested, safe, clamped=False, unsafe=True)
    gib = max(1, min(requested, safe))
    return ExpertCache(gib, requested, safe, clamped=requested > safe, unsafe=False)


def footprint(
    mode: Residency,
    *,
    launch_ctx: int,
    model_size: int,
    line: ResidentLine | None = None,
    catalog_resident: int | None = None,
) -> int:
    """ER5 for ds4: the bytes a launch reserves in the ledger.

    The catalog's figure re-based to the launch context (D6) when the resident line is known,
    else the catalog's figure as it is, else ``min(size, 48 GiB)`` (D10: streamed experts are
    not resident). A fully resident model reserves at least its figure or its file, and never
    under 96 GiB (D7).
    """
    if line is not None:
        base = line.at(launch_ctx)
    elif catalog_resident is not None:
        base = catalog_resident
    else:
        base = min(model_size, STREAMED_FALLBACK_CAP)
    if mode is Residency.FULL:
        known = base if line is not None or catalog_resident is not None else model_size
        return max(known, FULL_RESIDENCY_FLOOR)
    return max(0, base)


def kv_disk_mb(configured: int | None) -> int:
    """D2, IN37: the disk KV budget in MiB (16,384 unless set; a setting must be positive).

    Raises:
        ValueError: A setting of zero or less.
    """
    if configured is None:
        return DEFAULT_KV_DISK_MB
    if configured <= 0:
        raise ValueError(f"ds4 disk KV budget must be a positive number of MiB, not {configured}")
    return configured


def exited_before_ready(message: str) -> bool:
    """SV10a: a start failure that may be a stale instance holding ds4's single-instance lock."""
    return "before becoming ready" in message or bool(_LOCK_REFUSAL.search(message))
