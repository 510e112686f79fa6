"""KV cache sizes from model geometry (pure): rules L9–L11 and S3–S4 of the reference.

Every function returns bytes, or None when the geometry lacks what it needs (the caller then
falls back to the heuristic, never to a guess presented as exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hostler.capacity.geometry import MAX_LAYERS, ModelGeometry
from hostler.capacity.units import KIB, round_half_up

__all__ = [
    "KV_CACHE_TYPES",
    "KvLinear",
    "bytes_per_element",
    "exact_per_slot_f16",
    "full_attention_kv",
    "heuristic_per_slot_kv",
    "hybrid_linearization",
    "kv_scale",
    "unfit_head_width",
    "windowed_linearization",
]

#: L9: bytes per cached element, by cache type.
_BYTES_PER_ELEMENT = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
#: The KV cache types llama.cpp's ``--cache-type-k/-v`` accept, as hostler prices them.
KV_CACHE_TYPES: tuple[str, ...] = tuple(_BYTES_PER_ELEMENT)
SWA_EXTRA_TOKENS = 2048
#: Elements per block of the quantized cache types (llama.cpp needs the head width divisible).
_BLOCK = 32


def unfit_head_width(geometry: ModelGeometry, cache_type: str | None) -> int | None:
    """A head width the blocks of a quantized cache type do not divide, else None.

    llama.cpp refuses to create such a cache; None also when the header does not say.
    """
    if (cache_type or "f16").lower() in {"f32", "f16", "bf16"}:
        return None
    widths = [*(_dims(geometry) or ())]
    widths += [w for w in (geometry.key_length_swa, geometry.value_length_swa) if w]
    return next((w for w in widths if w % _BLOCK), None)


def bytes_per_element(cache_type: str | None) -> float:
    """L9: bytes per KV element of a cache type (unknown types count as f16)."""
    return _BYTES_PER_ELEMENT.get((cache_type or "f16").lower(), 2.0)


def kv_scale(cache_type: str | None) -> float:
    """S3: a cache type's size relative to f16. Unspecified counts as q8_0."""
    name = (cache_type or "q8_0").lower()
    if name.startswith("q4"):
        return 0.30
    if name.startswith("q8"):
        return 0.55
    if name == "f32":
        return 2.0
    return 1.0


def heuristic_per_slot_kv(weights_bytes: int, ctx: int, cache_type: str | None) -> int:
    """S4: per-slot KV when the geometry is unreadable, scaled from the weights."""
    per_token_f16 = min(max(weights_bytes * 5e-6, 40 * KIB), 400 * KIB)
    return round_half_up(ctx * per_token_f16 * kv_scale(cache_type))


@dataclass(frozen=True, slots=True)
class KvLinear:
    """KV of one slot as a line: ``fixed + per_token × ctx`` bytes."""

    fixed: float
    per_token: float

    def at(self, ctx: int) -> int:
        """Bytes of one slot holding ``ctx`` tokens."""
        return round_half_up(self.fixed + self.per_token * ctx)


def _heads(geometry: ModelGeometry, layer: int) -> int | None:
    heads = geometry.head_count_kv
    if isinstance(heads, tuple):
        return heads[layer] if layer < len(heads) else None
    if heads is None:
        return geometry.head_count
    return heads


def _dims(geometry: ModelGeometry) -> tuple[int, int] | None:
    key, value = geometry.key_length, geometry.value_length
    if key is None or value is None:
        if not geometry.embedding_length or not geometry.head_count:
            return None
        width = geometry.embedding_length // geometry.head_count
        key = key if key is not None else width
        value = value if value is not None else width
    return key, value


def _owning_layers(geometry: ModelGeometry) -> int | None:
    # Past MAX_LAYERS the geometry is not a model's (the reader refuses it): never walk it.
    if not geometry.block_count or geometry.block_count > MAX_LAYERS:
        return None
    return max(0, min(geometry.block_count, geometry.block_count - geometry.shared_kv_layers))


def _pattern(geometry: ModelGeometry) -> tuple[bool, ...] | None:
    pattern = geometry.swa_pattern
    if pattern is None or geometry.block_count is None or len(pattern) != geometry.block_count:
        return None
    return pattern


def full_attention_kv(geometry: ModelGeometry, ctx: int, cache_type: str | None) -> int | None:
    """L10: KV bytes of a full-attention cache holding ``ctx`` tokens in total.

    ``ctx`` is the engine's whole context (per-turn window × slots). Without a KV head count
    (``head_count_kv``) there is no answer: the query heads are not assumed to be KV heads.
    """
    owning = _owning_layers(geometry)
    dims = _dims(geometry)
    if owning is None or dims is None or geometry.head_count_kv is None:
        return None
    key, value = dims
    bpe = bytes_per_element(cache_type)
    pattern = _pattern(geometry)
    if pattern is not None:
        key_swa = geometry.key_length_swa or key
        value_swa = geometry.value_length_swa or value
        total = 0
        for layer in range(owning):
            heads = _heads(geometry, layer)
            if heads is None:
                return None
            total += heads * ((key_swa + value_swa) if pattern[layer] else (key + value))
        return math.ceil(total * ctx * bpe)
    heads = _heads(geometry, 0)
    if heads is None:
        return None
    interval = geometry.full_attention_interval
    if interval and interval > 1:
        scaling = sum(1 for layer in range(owning) if (layer + 1) % interval == 0)
    else:
        scaling = owning
    return math.ceil(scaling * ctx * heads * (key + value) * bpe)


def windowed_linearization(geometry: ModelGeometry, cache_type: str | None) -> KvLinear | None:
    """L11: one slot's KV for a sliding-window model (SWA layers cost a fixed block)."""
    pattern = _pattern(geometry)
    owning = _owning_layers(geometry)
    dims = _dims(geometry)
    window = geometry.sliding_window
    if pattern is None or owning is None or dims is None or not window:
        return None
    key, value = dims
    key_swa = geometry.key_length_swa or key
    value_swa = geometry.value_length_swa or value
    bpe = bytes_per_element(cache_type)
    fixed = 0.0
    slope = 0.0
    for layer in range(owning):
        heads = _heads(geometry, layer)
        if heads is None:
            return None
        if pattern[layer]:
            fixed += heads * (key_swa + value_swa) * bpe * (window + SWA_EXTRA_TOKENS)
        else:
            slope += heads * (key + value) * bpe
    return KvLinear(fixed, slope)


def hybrid_linearization(geometry: ModelGeometry, cache_type: str | None) -> KvLinear | None:
    """L11: one slot's KV for a linear-attention hybrid (linear layers hold a fixed state)."""
    interval = geometry.full_attention_interval
    owning = _owning_layers(geometry)
    dims = _dims(geometry)
    inner, kernel, state = (
        geometry.ssm_inner_size,
        geometry.ssm_conv_kernel,
        geometry.ssm_state_size,
    )
    if not interval or interval < 2 or owning is None or dims is None:
        return None
    if inner is None or kernel is None or state is None:
        return None
    heads = _heads(geometry, 0)
    if heads is None:
        return None
    key, value = dims
    full_layers = sum(1 for layer in range(owning) if (layer + 1) % interval == 0)
    linear_layers = owning - full_layers
    slope = full_layers * heads * (key + value) * bytes_per_element(cache_type)
    fixed = linear_layers * ((inner * (kernel - 1)) + inner * state) * 4
    return KvLinear(float(fixed), slope)


def exact_linearization(geometry: ModelGeometry, cache_type: str | None) -> KvLinear | None:
    """One slot's KV as a line: windowed if it applies, else hybrid, else full attention."""
    line = windowed_linearization(geometry, cache_type) or hybrid_linearization(
        geometry, cache_type
    )
    if line is not None:
        return line
    # full_attention_kv rounds up per call; take the slope from a large context
    reference = 4096
    total = full_attention_kv(geometry, reference, cache_type)
    return None if total is None else KvLinear(0.0, total / reference)


def exact_per_slot_f16(geometry: ModelGeometry, ctx: int) -> int | None:
    """L11: exact f16 KV of one slot at ``ctx`` tokens (windowed, else hybrid, else full)."""
    line = exact_linearization(geometry, "f16")
    return None if line is None else line.at(ctx)
