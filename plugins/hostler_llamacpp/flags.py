"""llama-server's argv (pure): the launch order of §3.1 and the engine flags of rule L14.

Per field the operator's config wins over the model's manifest tuning, which wins over what
hostler's planner decided; the operator's extra arguments come last and override anything
earlier (a flag given twice keeps its last value, at its last place). Nothing here reads a
file, the environment or a clock: every input is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_CACHE_REUSE",
    "FLAGS_POLICY",
    "FLAGS_POLICY_VERSION",
    "FlagSet",
    "Planned",
    "effective_values",
    "is_quantized",
    "llama_flags",
    "merge_flags",
]

FLAGS_POLICY = "llamacpp-flags"
FLAGS_POLICY_VERSION = 1
#: L14: ``--cache-reuse`` when nothing says otherwise (at any slot count; 0 disables it).
DEFAULT_CACHE_REUSE = 256
#: Cache types that are not block-quantized: they need no flash attention.
_FULL_PRECISION = frozenset({"f16", "bf16", "f32"})
#: Speculative types that need the model to carry multi-token-prediction layers.
_NEEDS_MTP = frozenset({"draft-mtp"})
#: Plain ``--flag value`` settings, in the order L14 lists them.
_VALUED = (
    ("threads", "--threads"),
    ("batch_size", "--batch-size"),
    ("ubatch_size", "--ubatch-size"),
    ("chat_template", "--chat-template"),
)

Value = str | int | float | bool
Pair = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class Planned:
    """What hostler's planner decided: the lowest precedence of every field.

    Attributes:
        n_gpu_layers: Layers on the card (-1 or ``all``: every one; None: the engine's call).
        cpu_moe: Every expert in RAM (L12).
        n_cpu_moe: The first N layers' experts in RAM (L12's partial split).
        swa_full: L7's ``--swa-full`` verdict (None: none given).
        mtp_confirmed: The model (or its companion file) has multi-token-prediction layers.
    """

    n_gpu_layers: int | str | None = None
    cpu_moe: bool | None = None
    n_cpu_moe: int | None = None
    swa_full: bool | None = None
    mtp_confirmed: bool = False


@dataclass(frozen=True, slots=True)
class FlagSet:
    """An argv (without the binary) and why it is what it is.

    Attributes:
        argv: The flags in launch order, extras last.
        reasons: Each rule that added, forced or dropped a flag, in order.
        decision: The rule's name, version and every input used.
    """

    argv: list[str]
    reasons: list[str] = field(default_factory=list)
    decision: dict[str, object] = field(default_factory=dict)


def is_quantized(kv_type: str | None) -> bool:
    """A block-quantized cache type (its V cache needs flash attention in llama.cpp)."""
    return kv_type is not None and kv_type.lower() not in _FULL_PRECISION


def _flag(raw: str) -> str:
    return raw if raw.startswith("-") else f"--{raw}"


def merge_flags(base: list[Pair], extra: Mapping[str, Value]) -> list[str]:
    """Flags in order, with operator extras last; a flag given again replaces the earlier one.

    ``True`` is a bare flag, ``False`` removes the flag, anything else is its value. Keys are
    normalised to ``--key``.
    """
    merged: dict[str, str | None] = {}
    for flag, text in base:
        merged.pop(flag, None)
        merged[flag] = text
    for raw, value in extra.items():
        flag = _flag(raw)
        merged.pop(flag, None)
        if value is False:
            continue
        merged[flag] = None if value is True else str(value)
    argv: list[str] = []
    for flag, text in merged.items():
        argv.append(flag)
        if text is not None:
            argv.append(text)
    return argv


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not token.lstrip("-").replace(".", "", 1).isdigit()


def effective_values(argv: list[str]) -> dict[str, str | None]:
    """What each flag of an argv is in effect: its last occurrence (None for a bare flag).

    A token starting with ``-`` is a flag unless it is a number (``--seed -1``).
    """
    values: dict[str, str | None] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        if not _is_flag(token):
            index += 1
            continue
        following = argv[index + 1] if index + 1 < len(argv) else None
        if following is not None and not _is_flag(following):
            values[token] = following
            index += 2
        else:
            values[token] = None
            index += 1
    return values


class _Fields:
    """Per field: the config's value, else the manifest tuning's, else None."""

    def __init__(self, config: Mapping[str, object], tuning: Mapping[str, object]) -> None:
        self._layers = (config, tuning)

    def get(self, key: str) -> object:
        for layer in self._layers:
            value = layer.get(key)
            if value is not None:
                return value
        return None


def _offload(fields: _Fields, planned: Planned) -> list[Pair]:
    pairs: list[Pair] = []
    layers = fields.get("n_gpu_layers")
    layers = planned.n_gpu_layers if layers is None else layers
    if layers is not None:
        pairs.append(("--n-gpu-layers", "all" if str(layers) == "-1" else str(layers)))
    cpu_moe = fields.get("cpu_moe")
    explicit_off = cpu_moe is False
    cpu_moe = planned.cpu_moe if cpu_moe is None else cpu_moe
    if cpu_moe is True:
        return [*pairs, ("--cpu-moe", None)]
    n_cpu_moe = fields.get("n_cpu_moe")
    if n_cpu_moe is None and not explicit_off:
        n_cpu_moe = planned.n_cpu_moe  # an explicit cpu_moe=false drops the planner's split
    if n_cpu_moe is not None:
        pairs.append(("--n-cpu-moe", str(n_cpu_moe)))
    return pairs


def _flash_attn(fields: _Fields, kv_type: str | None, reasons: list[str]) -> list[Pair]:
    value = fields.get("flash_attn")
    quantized = is_quantized(kv_type)
    if value is None:
        if not quantized:
            return []
        reasons.append(f"--flash-attn on: a {kv_type} V cache needs flash attention")
        return [("--flash-attn", "on")]
    if value is False:  # legacy false: leave it to the engine
        return []
    text = "on" if value is True else str(value).strip().lower()
    if text == "off" and quantized:
        reasons.append(f"--flash-attn off as configured: llama.cpp refuses a {kv_type} V cache")
    return [("--flash-attn", text)]


def _cache_reuse(value: object) -> list[Pair]:
    if value is None or value is True:
        value = DEFAULT_CACHE_REUSE
    text = str(value).strip()
    if value is False or text == "0":
        return []
    return [("--cache-reuse", text)]


def _speculative(fields: _Fields, planned: Planned, reasons: list[str]) -> list[Pair]:
    pairs: list[Pair] = []
    kind = fields.get("spec_type")
    if kind is not None and str(kind) != "none":
        if str(kind) in _NEEDS_MTP and not planned.mtp_confirmed:
            reasons.append(f"--spec-type {kind} dropped: the model has no confirmed MTP layers")
        else:
            pairs.append(("--spec-type", str(kind)))
    for key, flag in (
        ("spec_draft_model", "--spec-draft-model"),
        ("spec_draft_n_max", "--spec-draft-n-max"),
    ):
        value = fields.get(key)
        if value is not None:
            pairs.append((flag, str(value)))
    return pairs


def _engine_fragment(
    fields: _Fields, planned: Planned, kv_type: str | None, reasons: list[str]
) -> list[Pair]:
    """L14's engine flags, in its order."""
    pairs = _offload(fields, planned)
    pairs += _flash_attn(fields, kv_type, reasons)
    pairs += _cache_reuse(fields.get("cache_reuse"))
    swa_full = fields.get("swa_full")
    swa_full = planned.swa_full if swa_full is None else swa_full
    if swa_full is True:
        pairs.append(("--swa-full", None))
    for key, flag in _VALUED:
        value = fields.get(key)
        if value is not None:
            pairs.append((flag, str(value)))
    pairs += _speculative(fields, planned, reasons)
    reasoning_format = fields.get("reasoning_format")
    if reasoning_format is not None:
        pairs.append(("--reasoning-format", str(reasoning_format)))
    if fields.get("reasoning_preserve") is True:
        pairs.append(("--reasoning-preserve", None))
    return pairs


def _extras(extra_args: Mapping[str, Value]) -> dict[str, Value]:
    """Extras as given, except that ``--cache-reuse 0`` there also means off."""
    return {
        raw: False if _flag(raw) == "--cache-reuse" and str(value).strip() == "0" else value
        for raw, value in extra_args.items()
    }


def llama_flags(
    *,
    model: str,
    port: int,
    ctx_per_slot: int,
    slots: int,
    kv_type: str | None = None,
    slot_save_path: str | None = None,
    config: Mapping[str, object] | None = None,
    tuning: Mapping[str, object] | None = None,
    planned: Planned | None = None,
    extra_args: Mapping[str, Value] | None = None,
    embeddings: bool = False,
    pooling: str | None = None,
) -> FlagSet:
    """§3.1 and L14: llama-server's flags for one launch, extras last and winning.

    Order: ``--model``, ``--host 127.0.0.1``, ``--port``, ``--jinja``, ``--ctx-size``
    (per-slot window × slots), ``--parallel``, ``--slot-save-path``, ``--cache-type-k/-v``,
    ``--mlock``, the engine flags (GPU layers, ``--cpu-moe`` or ``--n-cpu-moe``,
    ``--flash-attn``, ``--cache-reuse``, ``--swa-full``, threads, batch sizes, chat template,
    speculative decoding, reasoning format), ``--mmproj`` (only with ``vision`` opted in),
    ``--reasoning-budget``, ``--embeddings`` (with ``embeddings``) and ``--pooling`` when
    given, then ``extra_args``.

    Args:
        model: The GGUF file.
        port: The loopback port.
        ctx_per_slot: The planned per-slot window.
        slots: ``--parallel`` (at least 1).
        kv_type: ``--cache-type-k/-v`` (None: the engine's default).
        slot_save_path: Where slots are saved (None: no saving).
        config: The operator's settings (highest precedence per field).
        tuning: The model manifest's tuning.
        planned: The planner's decisions (lowest precedence).
        extra_args: Operator flags appended last (True bare, False removes, else a value).
        embeddings: L21: serve ``/v1/embeddings`` too.
        pooling: ``--pooling`` for those (None: the model's own; a chat model has none, and
            llama-server then refuses every embedding).
    """
    config = config or {}
    tuning = tuning or {}
    planned = planned or Planned()
    extra_args = extra_args or {}
    fields = _Fields(config, tuning)
    count = max(1, slots)
    reasons: list[str] = []
    pairs: list[Pair] = [
        ("--model", model),
        ("--host", "127.0.0.1"),
        ("--port", str(port)),
        ("--jinja", None),
        ("--ctx-size", str(ctx_per_slot * count)),
        ("--parallel", str(count)),
    ]
    if slot_save_path is not None:
        pairs.append(("--slot-save-path", slot_save_path))
    if kv_type:
        pairs += [("--cache-type-k", kv_type), ("--cache-type-v", kv_type)]
    if fields.get("mlock") is True:
        pairs.append(("--mlock", None))
    pairs += _engine_fragment(fields, planned, kv_type, reasons)
    mmproj = fields.get("mmproj")
    if mmproj is not None and fields.get("vision") is True:
        pairs.append(("--mmproj", str(mmproj)))
    budget = fields.get("reasoning_budget")
    if budget is not None:
        pairs.append(("--reasoning-budget", str(budget)))
    if embeddings:  # L21: /v1/embeddings from the same engine
        pairs.append(("--embeddings", None))
        if pooling is not None:
            pairs.append(("--pooling", pooling))
    argv = merge_flags(pairs, _extras(extra_args))
    decision: dict[str, object] = {
        "policy": FLAGS_POLICY,
        "version": FLAGS_POLICY_VERSION,
        "model": model,
        "port": port,
        "ctx_per_slot": ctx_per_slot,
        "slots": count,
        "kv_type": kv_type,
        "slot_save_path": slot_save_path,
        "config": dict(config),
        "tuning": dict(tuning),
        "planned": planned,
        "extra_args": dict(extra_args),
        "embeddings": embeddings,
        "pooling": pooling,
    }
    return FlagSet(argv, reasons, decision)
