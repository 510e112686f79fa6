"""What an ``mlx_lm.server`` launch holds at its peak (pure): M5, M6 and CB11-MLX.

Weights as CB11 prices them for MLX (on-disk size + 2% + 1 GiB of runtime), plus the KV cache
priced at f16 (MLX keeps it unquantized unless ``--kv-bits`` is passed), exact from the
geometry when it is known; unknown geometry prices one slot by the heuristic (the engine then
runs serial, M6).
"""

from __future__ import annotations

from hostler.plugin import ModelGeometry, exact_linearization, heuristic_per_slot_kv, round_half_up

__all__ = [
    "KV_TYPE",
    "MLX_HEADROOM",
    "RUNTIME_BYTES",
    "WEIGHTS_OVERHEAD",
    "estimate_mlx",
    "geometry_known",
    "weights_resident",
]

#: M5: MLX's KV cache is priced at f16.
KV_TYPE = "f16"
#: S5: the share of free memory held back from KV sizing for MLX's compute buffers.
MLX_HEADROOM = 0.35
#: CB11-MLX: the share added to the weights' on-disk size (102 / 100).
WEIGHTS_OVERHEAD = 1.02
#: CB11-MLX: the Python runtime, MLX and the tokenizer, fixed.
RUNTIME_BYTES = 1024 * 1024**2


def weights_resident(file_size: int) -> int:
    """CB11-MLX: the resident bytes of the weights and runtime (KV excluded)."""
    return round_half_up(102 * max(0, file_size), 100) + RUNTIME_BYTES


def geometry_known(geometry: ModelGeometry) -> bool:
    """Whether the KV cache can be priced exactly from the geometry (M6: else serial)."""
    return exact_linearization(geometry, KV_TYPE) is not None


def estimate_mlx(geometry: ModelGeometry, *, ctx_per_slot: int, slots: int) -> int:
    """The peak bytes of ``mlx_lm.server`` with ``slots`` sequences of ``ctx_per_slot`` tokens.

    Weights (:func:`weights_resident`) plus f16 KV: the geometry's exact line per slot, times
    the slots; with unknown geometry, one slot by the S4 heuristic (M6: serial).
    """
    ctx = max(1, ctx_per_slot)
    line = exact_linearization(geometry, KV_TYPE)
    if line is None:
        kv = heuristic_per_slot_kv(geometry.file_size, ctx, KV_TYPE)
    else:
        kv = line.at(ctx) * max(1, slots)
    return weights_resident(geometry.file_size) + kv
