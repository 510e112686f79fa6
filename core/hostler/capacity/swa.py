"""Whether a sliding-window model gets llama.cpp's ``--swa-full`` (pure): rule L7's fit check.

A sliding-window (SWA) layer only ever attends to the last ``window`` tokens, so llama.cpp
keeps a small ring of cells for it (the *windowed* cache, L11). ``--swa-full`` makes every SWA
layer cache the whole context instead: prompts can then be reused from the cache across turns,
at the price of the full-attention KV (L10) for every layer. The reference turns it on by
default for Gemma when the weights plus that full cache fit fast memory beside what other
engines hold; an over-budget full cache is declined and the launch is planned windowed (a
31B Gemma ran out of Metal memory with it, IN28).

hostler reserves the windowed cache unless this verdict says ``--swa-full``: the caller must
then reserve :attr:`SwaFullVerdict.kv_bytes`, which is the full cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import full_attention_kv, windowed_linearization
from hostler.capacity.kvtrade import is_gemma
from hostler.capacity.units import GIB, format_half_up

__all__ = ["SWA_POLICY", "SWA_POLICY_VERSION", "SwaFullVerdict", "swa_full_verdict"]

SWA_POLICY = "swa-full"
SWA_POLICY_VERSION = 1


@dataclass(frozen=True, slots=True)
class SwaFullVerdict:
    """The ``--swa-full`` decision, its bytes, and why.

    Attributes:
        applies: The header shows a sliding-window layout (pattern, window, dimensions).
        swa_full: Pass ``--swa-full``.
        fits: Weights + the full cache fit fast memory beside other engines; None when the
            layout is unknown (nothing priced).
        full_kv: KV bytes with every layer caching the whole context (window × slots).
        windowed_kv: KV bytes of the windowed cache, every slot.
        kv_bytes: What the engine will allocate: ``full_kv`` with ``--swa-full``, else
            ``windowed_kv`` (None when not priced).
        needed: Weights + ``full_kv``.
        available: Fast budget − what other engines hold.
        reason: One line a person reads.
        decision: The rule's name, version and every input used.
    """

    applies: bool
    swa_full: bool
    fits: bool | None
    full_kv: int | None
    windowed_kv: int | None
    kv_bytes: int | None
    needed: int | None
    available: int
    reason: str
    decision: dict[str, object] = field(default_factory=dict)


def _gib(value: int) -> str:
    return f"{format_half_up(value, 1, per=GIB)} GiB"


def swa_full_verdict(
    geometry: ModelGeometry,
    *,
    model: str,
    ctx_per_slot: int,
    slots: int,
    kv_type: str | None,
    weights_resident: int,
    fast_budget: int,
    committed_other: int,
    explicit: bool | None = None,
    full_plan_degraded: bool = False,
) -> SwaFullVerdict:
    """L7: price the full SWA cache and decide ``--swa-full``.

    The operator's value wins (``explicit``); without one, a Gemma gets ``--swa-full`` only
    when weights + the full cache at ``ctx_per_slot × slots`` fit ``fast_budget −
    committed_other`` (equality fits) and the full-attention plan was not cut
    (``full_plan_degraded``: minimum unmet, slots shed or window clamped). Every other model
    stays windowed. A header without a sliding-window layout prices nothing: only an
    explicit True passes the flag through.
    """
    count = max(1, slots)
    available = fast_budget - committed_other
    gemma = is_gemma(geometry.architecture, model)
    inputs: dict[str, object] = {
        "policy": SWA_POLICY,
        "version": SWA_POLICY_VERSION,
        "model": model,
        "gemma": gemma,
        "ctx_per_slot": ctx_per_slot,
        "slots": count,
        "kv_type": kv_type,
        "weights_resident": weights_resident,
        "fast_budget": fast_budget,
        "committed_other": committed_other,
        "explicit": explicit,
        "full_plan_degraded": full_plan_degraded,
    }
    line = windowed_linearization(geometry, kv_type)
    full = full_attention_kv(geometry, ctx_per_slot * count, kv_type)
    if line is None or full is None:
        swa_full = explicit is True
        reason = (
            "no sliding-window layout in the header: nothing to price"
            if line is None
            else "no KV head count in the header: the full cache cannot be priced"
        ) + ("; --swa-full as the operator asked" if swa_full else "")
        inputs.update(applies=False, swa_full=swa_full, fits=None)
        return SwaFullVerdict(
            False, swa_full, None, None, None, None, None, available, reason, inputs
        )
    windowed = count * line.at(ctx_per_slot)
    needed = weights_resident + full
    fits = needed <= available
    sizes = f"weights + full cache {_gib(needed)} against {_gib(available)}"
    if explicit is not None:
        swa_full = explicit
        reason = f"--swa-full {'on' if explicit else 'off'} as the operator asked ({sizes})"
    elif not gemma:
        swa_full = False
        reason = "windowed cache: --swa-full is only automatic for Gemma"
    elif not fits:
        swa_full = False
        reason = f"--swa-full declined: {sizes} does not fit"
    elif full_plan_degraded:
        swa_full = False
        reason = f"--swa-full declined: the full-cache plan had to shed slots or context ({sizes})"
    else:
        swa_full = True
        reason = f"--swa-full: {sizes} fits"
    kv_bytes = full if swa_full else windowed
    inputs.update(
        applies=True,
        swa_full=swa_full,
        fits=fits,
        full_kv=full,
        windowed_kv=windowed,
        needed=needed,
        available=available,
    )
    return SwaFullVerdict(
        True, swa_full, fits, full, windowed, kv_bytes, needed, available, reason, inputs
    )
