"""Read a model's geometry from its GGUF header, and nothing else (driver: reads the file).

The reader walks the header's key/value section through a read-only memory map with a bounds
check on every step, so a truncated, non-GGUF or hostile file (a string or array claiming more
bytes than the file has, absurd counts) fails fast with an error naming the file and the field,
without allocating anything from the header's claims. Tensors are never read.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from hostler.capacity.geometry import ModelGeometry
from hostler.errors import ModelFileError

__all__ = ["SkippedArray", "read_geometry", "read_metadata"]

GGUF_MAGIC = b"GGUF"
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
#: Arrays longer than this are skipped, not decoded (tokenizer vocabularies): geometry never
#: needs them, and a per-layer array is at most a few hundred entries.
_KEEP_ARRAY = 4096
_MAX_KEY = 65_536


@dataclass(frozen=True, slots=True)
class SkippedArray:
    """A long array (a vocabulary) that was stepped over, not decoded: only its length."""

    count: int


class _Header:
    def __init__(self, path: Path, view: mmap.mmap | bytes) -> None:
        self.path = path
        self.view = view
        self.size = len(view)
        self.pos = 0

    def fail(self, field: str, why: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {field}: {why}")

    def take(self, count: int, field: str) -> int:
        if count < 0 or self.pos + count > self.size:
            raise self.fail(
                field,
                f"needs {count} bytes at offset {self.pos} but the file ends at {self.size} "
                "(truncated or not a GGUF model)",
            )
        start = self.pos
        self.pos += count
        return start

    def scalar(self, kind: int, field: str) -> Any:
        fmt, width = _SCALARS[kind]
        return struct.unpack_from(fmt, self.view, self.take(width, field))[0]

    def u64(self, field: str) -> int:
        return int(struct.unpack_from("<Q", self.view, self.take(8, field))[0])

    def string(self, field: str, *, limit: int | None = None) -> str:
        length = self.u64(field)
        if limit is not None and length > limit:
            raise self.fail(field, f"claims a {length}-byte string (at most {limit} expected)")
        start = self.take(length, field)
        return bytes(self.view[start : start + length]).decode("utf-8", errors="replace")

    def value(self, kind: int, field: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, field)
        if kind == GGUFValueType.STRING:
            return self.string(field)
        if kind == GGUFValueType.ARRAY:
            item = int(self.scalar(GGUFValueType.UINT32, f"{field} (array type)"))
            count = self.u64(f"{field} (array length)")
            return self.array(item, count, field)
        raise self.fail(field, f"unknown value type {kind}")

    def array(self, item: int, count: int, field: str) -> list[Any] | SkippedArray | None:
        if item in _SCALARS:
            width = _SCALARS[item][1]
            if count > (self.size - self.pos) // width:
                raise self.fail(field, f"claims {count} elements; the file cannot hold them")
            if count > _KEEP_ARRAY:
                self.take(count * width, field)
                return SkippedArray(count)
            fmt = _SCALARS[item][0]
            start = self.take(count * width, field)
            return list(struct.iter_unpack(fmt, self.view[start : start + count * width]))
        if item == GGUFValueType.STRING:
            if count > (self.size - self.pos) // 8:
                raise self.fail(field, f"claims {count} strings; the file cannot hold them")
            keep = count <= _KEEP_ARRAY
            out: list[Any] = []
            for _ in range(count):
                length = self.u64(field)
                start = self.take(length, field)
                if keep:
                    out.append(bytes(self.view[start : start + length]).decode("utf-8", "replace"))
            return out if keep else SkippedArray(count)
        if item == GGUFValueType.ARRAY:
            if count > (self.size - self.pos) // 12:
                raise self.fail(field, f"claims {count} nested arrays; the file cannot hold them")
            for _ in range(count):
                self.value(GGUFValueType.ARRAY, field)
            return None
        raise self.fail(field, f"unknown array element type {item}")


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header's key/value metadata (long arrays such as vocabularies left out)."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < 24:
                raise ModelFileError(f"{file}: header: {size} bytes is too short for a GGUF model")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
                return _parse(file, view)
    except FileNotFoundError:
        raise ModelFileError(f"{file}: no such model file") from None
    except IsADirectoryError:
        raise ModelFileError(f"{file}: is a directory, not a model file") from None
    except PermissionError:
        raise ModelFileError(f"{file}: cannot be read (permission denied)") from None


def _parse(path: Path, view: mmap.mmap) -> dict[str, Any]:
    header = _Header(path, view)
    magic = bytes(view[0:4])
    if magic != GGUF_MAGIC:
        raise header.fail("magic", f"starts with {magic!r}, not b'GGUF' (not a GGUF model)")
    header.pos = 4
    version = int(header.scalar(GGUFValueType.UINT32, "version"))
    if version not in {2, 3}:
        raise header.fail("version", f"GGUF version {version} is not supported (2 or 3)")
    tensors = header.u64("tensor_count")
    kv_count = header.u64("kv_count")
    remaining = header.size - header.pos
    # Each key/value needs at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes;
    # each tensor info at least 8 + 1 + 4 + 8 + 4 + 8.
    if kv_count > remaining // 14:
        raise header.fail("kv_count", f"claims {kv_count} entries; the file cannot hold them")
    if tensors > remaining // 33:
        raise header.fail("tensor_count", f"claims {tensors} tensors; the file cannot hold them")
    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        key = header.string(f"key #{index}", limit=_MAX_KEY)
        kind = int(header.scalar(GGUFValueType.UINT32, f"{key} (type)"))
        metadata[key] = header.value(kind, key)
    metadata["__tensor_count__"] = tensors
    metadata["__tensor_data_bytes__"] = _tensor_data_bytes(header, tensors, metadata)
    return metadata


#: Tensors read by row lookup, not by matrix products (never repacked).
_LOOKUP_TENSORS = ("token_embd.", "per_layer_token_embd.", "position_embd.", "token_types.")


def _tensor_data_bytes(header: _Header, tensors: int, metadata: dict[str, Any]) -> int | None:
    """Bytes of tensor data: the file minus everything before the (aligned) data section.

    On the way, the bytes of matrix-product weights per tensor type go to
    ``metadata["__matmul_bytes__"]`` and every tensor's place in the data section to
    ``metadata["__layout__"]`` (arithmetic on the header's numbers; nothing allocated).
    """
    matmul: dict[str, int] = {}
    layout: list[tuple[str, int, int, bool]] = []
    embedding: int | None = None
    has_output = False
    known = True
    for index in range(tensors):
        field = f"tensor #{index}"
        name = header.string(field, limit=_MAX_KEY)
        dims = int(header.scalar(GGUFValueType.UINT32, f"{field} (dims)"))
        if dims > 8:
            raise header.fail(field, f"claims {dims} dimensions")
        shape = [header.u64(f"{field} (shape)") for _ in range(dims)]
        kind = int(header.scalar(GGUFValueType.UINT32, f"{field} (type)"))
        offset = header.u64(f"{field} (offset)")
        sized = _tensor_size(kind, shape)
        if sized is None:
            known = False
            continue
        product = dims >= 2 and not name.startswith(_LOOKUP_TENSORS)
        has_output = has_output or name == "output.weight"
        if dims >= 2 and name == "token_embd.weight":
            embedding = len(layout)
        layout.append((sized[0], offset, sized[1], product))
    if embedding is not None and not has_output:  # tied head: the embedding is a product too
        type_name, start, size, _ = layout[embedding]
        layout[embedding] = (type_name, start, size, True)
    for type_name, _, size, product in layout:
        if product:
            matmul[type_name] = matmul.get(type_name, 0) + size
    metadata["__matmul_bytes__"] = tuple(sorted(matmul.items()))
    metadata["__layout__"] = tuple(layout) if known else ()
    alignment = metadata.get("general.alignment", 32)
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
    start = -(-header.pos // alignment) * alignment
    return max(0, header.size - start)


def _tensor_size(kind: int, shape: list[int]) -> tuple[str, int] | None:
    """``(type name, bytes)`` of one tensor, or None for a type this reader does not know."""
    try:
        quant = GGMLQuantizationType(kind)
    except ValueError:
        return None
    block, size = GGML_QUANT_SIZES.get(quant, (0, 0))
    if not block:
        return None
    elements = math.prod(shape)
    return quant.name.lower(), elements // block * size


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _flat(value: Any) -> list[Any] | None:
    if not isinstance(value, list):
        return None
    return [v[0] if isinstance(v, tuple) else v for v in value]


def read_geometry(
    path: str | os.PathLike[str], *, mmproj: str | os.PathLike[str] | None = None
) -> ModelGeometry:
    """The geometry of a GGUF model (and the size of its vision projector, if given).

    Raises:
        ModelFileError: The file is missing, not GGUF, truncated, or claims the impossible.
    """
    file = Path(path)
    meta = read_metadata(file)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{file}: general.architecture: missing (not a model GGUF?)")

    def get(suffix: str) -> Any:
        return meta.get(f"{arch}.{suffix}")

    block_count = _int(get("block_count"))
    heads_kv_raw = get("attention.head_count_kv")
    flat = _flat(heads_kv_raw)
    heads_kv: int | tuple[int, ...] | None = (
        tuple(int(v) for v in flat) if flat is not None else _int(heads_kv_raw)
    )
    pattern_raw = get("attention.sliding_window_pattern")
    pattern: tuple[bool, ...] | None = None
    flat_pattern = _flat(pattern_raw)
    if flat_pattern is not None:
        pattern = tuple(bool(v) for v in flat_pattern)
    elif (period := _int(pattern_raw)) and block_count:
        # a period P: every Pth layer is global, the others slide
        pattern = tuple((layer + 1) % period != 0 for layer in range(block_count))
    mmproj_size = 0
    if mmproj is not None:
        try:
            mmproj_size = Path(mmproj).stat().st_size
        except OSError as exc:
            raise ModelFileError(f"{mmproj}: projector unreadable ({exc.strerror})") from exc
    return ModelGeometry(
        architecture=arch,
        block_count=block_count,
        head_count=_int(get("attention.head_count")),
        head_count_kv=heads_kv,
        key_length=_int(get("attention.key_length")),
        value_length=_int(get("attention.value_length")),
        key_length_swa=_int(get("attention.key_length_swa")),
        value_length_swa=_int(get("attention.value_length_swa")),
        embedding_length=_int(get("embedding_length")),
        sliding_window=_int(get("attention.sliding_window")),
        swa_pattern=pattern,
        shared_kv_layers=_int(get("attention.shared_kv_layers")) or 0,
        full_attention_interval=_int(get("full_attention_interval")),
        ssm_inner_size=_int(get("ssm.inner_size")),
        ssm_conv_kernel=_int(get("ssm.conv_kernel")),
        ssm_state_size=_int(get("ssm.state_size")),
        native_context=_int(get("context_length")),
        expert_count=_int(get("expert_count")),
        file_size=file.stat().st_size,
        tensor_bytes=_int(meta.get("__tensor_data_bytes__")),
        matmul_bytes=meta.get("__matmul_bytes__", ()),
        tensor_layout=meta.get("__layout__", ()),
        mmproj_size=mmproj_size,
        vocab_size=_vocab_size(meta, arch),
        merge_count=_count(meta.get("tokenizer.ggml.merges")),
    )


def _vocab_size(meta: dict[str, Any], arch: str) -> int | None:
    explicit = _int(meta.get(f"{arch}.vocab_size"))
    if explicit:
        return explicit
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        return tokens.count
    return len(tokens) if isinstance(tokens, list) else None


def _count(value: Any) -> int:
    if isinstance(value, SkippedArray):
        return value.count
    return len(value) if isinstance(value, list) else 0
