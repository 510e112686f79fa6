"""Which KV cache type a llama.cpp launch uses (pure): rule L5 of the reference, in its order.

1. The operator's type wins, whatever it is.
2. Otherwise Gemma keeps f16 (q8_0 garbled its recalled tokens, IN27) and every other model
   uses q8_0 (about half the bytes).
3. A quantized default falls back to f16 when llama.cpp could not build it: the V cache is
   only quantized with flash attention, so an operator's ``--flash-attn off`` rules q8_0 out,
   and the blocks of 32 elements must divide every head width.
4. Gemma trades f16 for q8_0 only when that buys a second slot: no operator type or slot
   count, a tier of at least two slots, f16 leaving one slot and q8_0 allowing two or more
   (a single-slot sliding-window model re-prefills a whole other session on every switch).

q4 types are never chosen automatically: they cost more quality than the slot they may buy.
Every answer carries the rule's name and version and the inputs it used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "FULL_PRECISION",
    "KV_POLICY",
    "KV_POLICY_VERSION",
    "KvChoice",
    "KvStep",
    "default_kv_choice",
    "gemma_trade",
    "is_gemma",
    "is_quantized",
]

KV_POLICY = "kv-type"
KV_POLICY_VERSION = 1
#: Cache types that are not block-quantized (need no flash attention, no block alignment).
FULL_PRECISION = frozenset({"f32", "f16", "bf16"})
#: The slot count the Gemma trade must buy (L5: "q8_0 ceiling >= 2").
TRADE_SLOTS = 2


class KvStep(StrEnum):
    """Which step of L5 decided the type."""

    EXPLICIT = "explicit"  # the operator's type
    DEFAULT = "default"  # Gemma f16, others q8_0
    NO_FLASH = "no-flash-attention"  # quantized V needs flash attention, which is off
    HEAD_WIDTH = "head-width"  # quantized blocks do not divide a head width
    TRADE = "gemma-trade"  # Gemma f16 → q8_0 for a second slot
    ENGINE = "engine"  # S9: the engine supports other types only


@dataclass(frozen=True, slots=True)
class KvChoice:
    """The KV cache type and why.

    Attributes:
        kv_type: ``--cache-type-k/-v``.
        step: The L5 step that decided it.
        reason: One line a person reads.
        decision: The rule's name, version and every input used.
        slot_ceiling: The slot ceiling at ``kv_type`` when the trade priced it, else None.
    """

    kv_type: str
    step: KvStep
    reason: str
    decision: dict[str, object] = field(default_factory=dict)
    slot_ceiling: int | None = None


def is_quantized(kv_type: str | None) -> bool:
    """A block-quantized cache type (``q8_0``, ``q4_0``...); None (engine default) is not."""
    return kv_type is not None and kv_type.lower() not in FULL_PRECISION


def is_gemma(architecture: str, model: str) -> bool:
    """L5: Gemma is an architecture starting ``gemma`` or ``gemma`` in the model's name."""
    return architecture.lower().startswith("gemma") or "gemma" in model.lower()


def _decision(step: KvStep, kv_type: str, **inputs: object) -> dict[str, object]:
    return {
        "policy": KV_POLICY,
        "version": KV_POLICY_VERSION,
        "step": step.value,
        "kv_type": kv_type,
        **inputs,
    }


def default_kv_choice(
    *,
    explicit: str | None,
    gemma: bool,
    flash_attn_off: bool = False,
    q8_unfit_width: int | None = None,
) -> KvChoice:
    """L5 steps 1–3: the operator's type, else the family default llama.cpp can build.

    Args:
        explicit: The operator's type (None: decide).
        gemma: The model is a Gemma (:func:`is_gemma`).
        flash_attn_off: The operator turned flash attention off (a quantized V cache then
            cannot be built).
        q8_unfit_width: A head width q8_0's blocks do not divide (None: they divide all).
    """
    inputs: dict[str, object] = {
        "explicit": explicit,
        "gemma": gemma,
        "flash_attn_off": flash_attn_off,
        "q8_unfit_width": q8_unfit_width,
    }
    if explicit:
        step = KvStep.EXPLICIT
        return KvChoice(
            explicit,
            step,
            f"KV {explicit}: set by the operator",
            _decision(step, explicit, **inputs),
        )
    if gemma:
        step = KvStep.DEFAULT
        return KvChoice(
            "f16", step, "KV f16: Gemma keeps full precision", _decision(step, "f16", **inputs)
        )
    if flash_attn_off:
        step = KvStep.NO_FLASH
        reason = "KV f16: q8_0 V cache needs flash attention, which the operator turned off"
        return KvChoice("f16", step, reason, _decision(step, "f16", **inputs))
    if q8_unfit_width is not None:
        step = KvStep.HEAD_WIDTH
        reason = f"KV f16: q8_0 blocks do not divide the head width {q8_unfit_width}"
        return KvChoice("f16", step, reason, _decision(step, "f16", **inputs))
    step = KvStep.DEFAULT
    return KvChoice("q8_0", step, "KV q8_0: the default", _decision(step, "q8_0", **inputs))


def gemma_trade(
    choice: KvChoice,
    *,
    allowed: bool = True,
    slots_configured: bool,
    tier: int,
    f16_ceiling: int,
    q8_ceiling: Callable[[], int],
) -> KvChoice:
    """L5 step 4: Gemma's f16 becomes q8_0 when only that gives it a second slot.

    ``choice`` is step 1–3's answer; ``q8_ceiling`` prices the q8_0 slot ceiling (called
    only when the other conditions hold); ``allowed`` is False when the engine cannot run q8_0
    (S9). Anything else keeps ``choice``.
    """
    gemma_default = choice.step is KvStep.DEFAULT and choice.kv_type == "f16"
    if not allowed or not gemma_default or slots_configured or tier < TRADE_SLOTS:
        return choice
    if choice.decision["flash_attn_off"] or choice.decision["q8_unfit_width"] is not None:
        return choice
    if f16_ceiling >= TRADE_SLOTS:
        return choice
    q8 = q8_ceiling()
    if q8 < TRADE_SLOTS:
        return choice
    step = KvStep.TRADE
    inputs = {**choice.decision, "tier": tier, "f16_ceiling": f16_ceiling, "q8_ceiling": q8}
    inputs.update(step=step.value, kv_type="q8_0")
    reason = f"KV f16 → q8_0: f16 leaves {f16_ceiling} slot, q8_0 allows {q8}"
    return KvChoice("q8_0", step, reason, inputs, q8)
