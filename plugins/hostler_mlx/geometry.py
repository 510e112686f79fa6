"""MLX model directories: ``config.json`` read into a :class:`ModelGeometry` (M10).

:func:`geometry_from_config` is pure (a parsed ``config.json`` and the weights' size in, a
geometry out); :func:`read_mlx_model` reads a directory and calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hostler.plugin import ModelFileError, ModelGeometry, parse_json, read_small_file

__all__ = [
    "CONFIG_FILE",
    "LINEAR_WINDOW",
    "MlxModel",
    "Quantization",
    "geometry_from_config",
    "quantization_from_config",
    "read_mlx_model",
    "weights_bytes",
]

#: The file that makes a directory an MLX model.
CONFIG_FILE = "config.json"
#: M10: the window a linear-attention layer is priced as, when the config names none.
LINEAR_WINDOW = 1024
#: ``layer_types`` entries that hold a bounded (windowed) cache, not a full one.
_WINDOWED = frozenset({"sliding_attention", "linear_attention"})
#: The largest config.json hostler reads (real ones are a few KiB).
_CONFIG_MAX = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Quantization:
    """MLX weight quantization (``quantization`` in config.json): bits and group size."""

    bits: int
    group_size: int


@dataclass(frozen=True, slots=True)
class MlxModel:
    """What a model directory says: its geometry and its weight quantization, if any."""

    geometry: ModelGeometry
    quantization: Quantization | None


def _count(value: object) -> int | None:
    """A positive whole number, else None (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def quantization_from_config(config: Mapping[str, object]) -> Quantization | None:
    """The weights' quantization, or None when unquantized or not readable."""
    raw = config.get("quantization") or config.get("quantization_config")
    if not isinstance(raw, Mapping):
        return None
    bits, group = _count(raw.get("bits")), _count(raw.get("group_size"))
    if bits is None or group is None or bits > 16:
        return None
    return Quantization(bits, group)


def _text(config: Mapping[str, object]) -> Mapping[str, object]:
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def geometry_from_config(config: Mapping[str, object], *, weights: int) -> ModelGeometry:
    """M10: the geometry of a parsed ``config.json`` (``text_config`` when present).

    Layers, query and KV heads, head width (``head_dim``, else hidden / heads); a
    ``layer_types`` list with ``sliding_attention`` / ``linear_attention`` entries gives a
    windowed shape (window ``sliding_window``, else :data:`LINEAR_WINDOW`), whose global
    layers use ``global_head_dim`` / ``num_global_key_value_heads`` when given. What cannot be
    read stays None (KV is then unknown: hostler prices it by the heuristic, and the MLX engine
    runs serial). ``weights`` is the bytes of the weight files.
    """
    text = _text(config)
    architecture = text.get("model_type") or config.get("model_type")
    layers = _count(text.get("num_hidden_layers"))
    heads = _count(text.get("num_attention_heads"))
    hidden = _count(text.get("hidden_size"))
    kv_heads = _count(text.get("num_key_value_heads")) or heads
    head_dim = _count(text.get("head_dim"))
    if head_dim is None and hidden is not None and heads is not None and hidden % heads == 0:
        head_dim = hidden // heads
    experts = _count(text.get("num_local_experts")) or _count(text.get("num_experts"))
    base = ModelGeometry(
        architecture=architecture if isinstance(architecture, str) else "",
        file_size=max(0, weights),
        native_context=_count(text.get("max_position_embeddings")),
        vocab_size=_count(text.get("vocab_size")),
        expert_count=experts,
        embedding_length=hidden,
    )
    if layers is None or heads is None or kv_heads is None or head_dim is None:
        return base  # unknown geometry: every KV field stays None
    types = text.get("layer_types")
    pattern: tuple[bool, ...] | None = None
    if (
        isinstance(types, list)
        and len(types) == layers
        and all(isinstance(t, str) for t in types)
        and any(t in _WINDOWED for t in types)
    ):
        pattern = tuple(t in _WINDOWED for t in types)
    if pattern is None:
        return ModelGeometry(
            architecture=base.architecture,
            block_count=layers,
            head_count=heads,
            head_count_kv=kv_heads,
            key_length=head_dim,
            value_length=head_dim,
            embedding_length=hidden,
            native_context=base.native_context,
            expert_count=experts,
            file_size=base.file_size,
            vocab_size=base.vocab_size,
        )
    global_dim = _count(text.get("global_head_dim")) or head_dim
    global_kv = _count(text.get("num_global_key_value_heads")) or kv_heads
    window = _count(text.get("sliding_window")) or LINEAR_WINDOW
    return ModelGeometry(
        architecture=base.architecture,
        block_count=layers,
        head_count=heads,
        head_count_kv=tuple(kv_heads if swa else global_kv for swa in pattern),
        key_length=global_dim,
        value_length=global_dim,
        key_length_swa=head_dim,
        value_length_swa=head_dim,
        embedding_length=hidden,
        sliding_window=window,
        swa_pattern=pattern,
        native_context=base.native_context,
        expert_count=experts,
        file_size=base.file_size,
        vocab_size=base.vocab_size,
    )


def weights_bytes(directory: Path) -> int:
    """Bytes of the weight files (``*.safetensors``) in ``directory``."""
    total = 0
    for path in directory.glob("*.safetensors"):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def read_config(directory: Path) -> Mapping[str, object]:
    """The parsed ``config.json`` of a model directory.

    The file is outside input: it must be a regular file (a FIFO is refused without waiting
    on it, a link to a device without reading it) of at most 4 MiB, and JSON that the decoder
    can read (nesting past its depth is refused like any bad JSON).

    Raises:
        ModelFileError: One line: no config.json, unreadable, not a regular file, too large,
            not JSON, not a JSON object.
    """
    path = directory / CONFIG_FILE
    try:
        raw = read_small_file(path, _CONFIG_MAX)
    except FileNotFoundError:
        raise ModelFileError(f"{directory}: no {CONFIG_FILE}, not an MLX model directory") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # a FIFO, a device, a directory, too large
        raise ModelFileError(f"{path}: {exc}") from None
    try:
        data = parse_json(raw)
    except ValueError as exc:  # not JSON, or nested past the decoder's depth
        raise ModelFileError(f"{path}: not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: not a JSON object")
    return data


def read_mlx_model(directory: Path) -> MlxModel:
    """The geometry and quantization of the MLX model in ``directory``.

    Raises:
        ModelFileError: ``config.json`` is missing or unreadable (see :func:`read_config`).
    """
    config = read_config(directory)
    geometry = geometry_from_config(config, weights=weights_bytes(directory))
    return MlxModel(geometry, quantization_from_config(config))
