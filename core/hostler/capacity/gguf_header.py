"""Read a model's geometry from its GGUF header, and nothing else (driver: reads the file).

The reader is bounded: whatever a file claims, it allocates and loops only in proportion to the
file's real size and to the limits of a real model.

* Only a regular file is read: a FIFO, a directory or a device is refused from ``stat``,
  before it is opened, and the file is opened without blocking and checked again (``fstat``)
  before it is mapped — ``preview`` on a named pipe never waits for a writer.
* The header's key/value section is walked through a read-only memory map with a bounds check
  on every step: a string, an array or a count claiming more bytes than the file has fails
  fast, without allocating anything from the claim; arrays nest at most
  :data:`MAX_ARRAY_NESTING` deep; every tensor's data must lie inside the file.
* Every value the geometry takes is checked for its type (an integer where a count belongs: no
  string, no array of strings, no NaN or infinity) and its range (the ``MAX_*`` limits of
  :mod:`hostler.capacity.geometry`: at most 4096 layers, 4096 heads, ...), so the planner's
  loops over layers are bounded and its arithmetic never overflows a float.

Every failure is a :class:`~hostler.errors.ModelFileError`: one line naming the file and the
key (or the field of the header), e.g. ``model.gguf: llama.attention.head_count_kv: expected an
integer or an array of integers, got an array of strings``. Tensors are never read.
"""

from __future__ import annotations

import functools
import hashlib
import math
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from hostler.capacity.geometry import (
    MAX_CONTEXT_TOKENS,
    MAX_EMBEDDING,
    MAX_EXPERTS,
    MAX_HEAD_WIDTH,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    ModelGeometry,
)
from hostler.errors import ModelFileError

__all__ = ["MAX_ARRAY_NESTING", "SkippedArray", "read_geometry", "read_metadata"]

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
#: needs them, and a per-layer array has at most one entry per layer.
_KEEP_ARRAY = MAX_LAYERS
_MAX_KEY = 65_536
#: Arrays of arrays deeper than this are refused (no model writes nested arrays at all).
MAX_ARRAY_NESTING = 4
#: ggml tensors have at most 4 dimensions; a little slack for future formats.
_MAX_DIMS = 8
#: The most characters of a key or tensor name a message quotes.
_SHOWN = 80
#: Keys whose presence marks a recurrent model (Mamba, RWKV): it may have no attention heads.
_RECURRENT = (".ssm.", ".wkv.")


@dataclass(frozen=True, slots=True)
class SkippedArray:
    """A long array (a vocabulary) that was stepped over, not decoded: only its length."""

    count: int


def _printable(text: str) -> str:
    """``text`` fit for a one-line message: control characters escaped, long names cut."""
    shown = text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."


class _Header:
    def __init__(self, path: Path, view: mmap.mmap | bytes) -> None:
        self.path = path
        self.view = view
        self.size = len(view)
        self.pos = 0

    def fail(self, field: str, why: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: {_printable(field)}: {why}")

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

    def value(self, kind: int, field: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, field)
        if kind == GGUFValueType.STRING:
            return self.string(field)
        if kind == GGUFValueType.ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise self.fail(field, f"arrays nested more than {MAX_ARRAY_NESTING} deep")
            item = int(self.scalar(GGUFValueType.UINT32, f"{field} (array type)"))
            count = self.u64(f"{field} (array length)")
            return self.array(item, count, field, depth)
        raise self.fail(field, f"unknown value type {kind}")

    def array(
        self, item: int, count: int, field: str, depth: int
    ) -> list[Any] | SkippedArray | None:
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
                self.value(GGUFValueType.ARRAY, field, depth + 1)
            return None
        raise self.fail(field, f"unknown array element type {item}")


_NOT_REGULAR: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_irregular(file: str | os.PathLike[str], mode: int, what: str) -> None:
    """Raise unless ``mode`` is a regular file's: nothing else is read, or waited on."""
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
    raise ModelFileError(f"{file}: is {kind}, not {what}")


def _unreadable(file: str | os.PathLike[str], exc: OSError | ValueError, what: str) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"{file}: no such {what}"
    if isinstance(exc, PermissionError):
        return f"{file}: cannot be read (permission denied)"
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{file}: cannot be read ({reason})"


def _open_model(file: Path) -> tuple[int, int]:
    """An open descriptor of the regular file ``file``, and its size; never blocks."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        _refuse_irregular(file, file.stat().st_mode, "a model file")
        fd = os.open(file, flags)
    except (OSError, ValueError) as exc:
        raise ModelFileError(_unreadable(file, exc, "model file")) from None
    try:
        status = os.fstat(fd)
        _refuse_irregular(file, status.st_mode, "a model file")  # swapped since the stat
    except BaseException:
        os.close(fd)
        raise
    return fd, status.st_size


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header's key/value metadata (long arrays such as vocabularies left out).

    Raises:
        ModelFileError: The file is missing, not a regular file, not GGUF, truncated, or
            claims more than it holds.
    """
    file = Path(path)
    fd, size = _open_model(file)
    try:
        if size < 24:
            raise ModelFileError(f"{file}: header: {size} bytes is too short for a GGUF model")
        try:
            view = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ModelFileError(_unreadable(file, exc, "model file")) from None
        with view:
            metadata = _parse(file, view)
    finally:
        os.close(fd)
    metadata["__file_size__"] = size
    return metadata


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


def _alignment(header: _Header, metadata: dict[str, Any]) -> int:
    """``general.alignment`` (32 when absent): a power of two, as llama.cpp requires."""
    if "general.alignment" not in metadata:
        return 32
    value = metadata["general.alignment"]
    number = _whole(value)
    if number is None or number < 1 or number & (number - 1):
        raise header.fail("general.alignment", f"expected a power of two, got {_describe(value)}")
    return number


def _tensor_data_bytes(header: _Header, tensors: int, metadata: dict[str, Any]) -> int:
    """Bytes of tensor data: the file minus everything before the (aligned) data section.

    On the way, the bytes of matrix-product weights per tensor type go to
    ``metadata["__matmul_bytes__"]`` and every tensor's place in the data section to
    ``metadata["__layout__"]`` (arithmetic on the header's numbers; nothing allocated). A
    tensor whose data would not lie inside the file is refused, as llama.cpp refuses it.
    """
    matmul: dict[str, int] = {}
    layout: list[tuple[str, int, int, bool]] = []
    names: list[str] = []
    embedding: int | None = None
    has_output = False
    known = True
    for index in range(tensors):
        field = f"tensor #{index}"
        name = header.string(field, limit=_MAX_KEY)
        dims = int(header.scalar(GGUFValueType.UINT32, f"{field} (dims)"))
        if dims > _MAX_DIMS:
            raise header.fail(field, f"claims {dims} dimensions (at most {_MAX_DIMS})")
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
        names.append(name)
    alignment = _alignment(header, metadata)
    start = -(-header.pos // alignment) * alignment
    data = max(0, header.size - start)
    for name, (_, offset, size, _) in zip(names, layout, strict=True):
        if offset + size > data:
            raise header.fail(
                f"tensor {name}",
                f"claims {size} bytes at offset {offset} of a data section of {data} bytes "
                "(truncated, or not a model)",
            )
    if embedding is not None and not has_output:  # tied head: the embedding is a product too
        type_name, offset, size, _ = layout[embedding]
        layout[embedding] = (type_name, offset, size, True)
    for type_name, _, size, product in layout:
        if product:
            matmul[type_name] = matmul.get(type_name, 0) + size
    metadata["__matmul_bytes__"] = tuple(sorted(matmul.items()))
    metadata["__layout__"] = tuple(layout) if known else ()
    return data


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


def _flat(value: Any) -> list[Any]:
    """A decoded array's items (scalars come out of ``struct`` as 1-tuples)."""
    return [v[0] if isinstance(v, tuple) else v for v in value]


def _whole(value: Any) -> int | None:
    """``value`` as a whole number, or None if it is none (a bool, NaN, 1.5, a string...)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


_KINDS = ((bool, "booleans"), (int, "integers"), (float, "floats"), (str, "strings"))


def _describe(value: Any) -> str:
    """What a header value is, in a few words, for a message."""
    if isinstance(value, list | SkippedArray) or value is None:
        return _describe_array(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "infinity" if value > 0 else "-infinity"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return repr(value)
    return "a string" if isinstance(value, str) else type(value).__name__


def _describe_array(value: list[Any] | SkippedArray | None) -> str:
    if isinstance(value, SkippedArray):
        return f"an array of {value.count} entries"
    if value is None:
        return "an array of arrays"
    items = _flat(value)
    if not items:
        return "an empty array"
    kind = next((name for cls, name in _KINDS if isinstance(items[0], cls)), "values")
    odd = next(
        (
            (index, item)
            for index, item in enumerate(items)
            if isinstance(item, float) and not math.isfinite(item)
        ),
        None,
    )
    where = f" (entry {odd[0]} is {_describe(odd[1])})" if odd else ""
    return f"an array of {kind}{where}"


class _Fields:
    """The header's values, each checked for its type and range before the geometry takes it."""

    def __init__(self, file: Path, meta: dict[str, Any], arch: str) -> None:
        self.file = file
        self.meta = meta
        self.arch = arch
        self.recurrent = any(
            key.startswith(f"{arch}.") and any(mark in key for mark in _RECURRENT) for key in meta
        )

    def fail(self, key: str, why: str) -> ModelFileError:
        return ModelFileError(f"{self.file}: {_printable(key)}: {why}")

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def count(self, suffix: str, low: int, high: int, zero: str = "") -> int | None:
        """An integer key of the architecture from ``low`` to ``high``; None when absent."""
        key = self.key(suffix)
        if key not in self.meta:
            return None
        return self.check(key, self.meta[key], low, high, zero)

    def check(self, key: str, value: Any, low: int, high: int, zero: str = "") -> int:
        """``value`` as an integer from ``low`` to ``high``; ``zero`` explains a refused 0."""
        number = _whole(value)
        if number is None:
            raise self.fail(key, f"expected an integer, got {_describe(value)}")
        if not low <= number <= high:
            shown = value if isinstance(value, int) else _describe(value)
            why = zero if number == 0 else ""
            raise self.fail(key, f"{shown} is out of range: expected {low} to {high}{why}")
        return number

    def per_layer(self, suffix: str, high: int) -> int | tuple[int, ...] | None:
        """One integer for every layer, or one per layer (at most :data:`MAX_LAYERS`)."""
        key = self.key(suffix)
        if key not in self.meta:
            return None
        value = self.meta[key]
        if value is not None and not isinstance(value, list | SkippedArray):
            return self.check(key, value, 0 if self.recurrent else 1, high, self.no_heads)
        if isinstance(value, SkippedArray):
            raise self.too_long(key, value)
        items = _flat(value) if value is not None else []
        numbers = [_whole(item) for item in items]
        if not items or any(number is None for number in numbers):
            raise self.fail(
                key, f"expected an integer or an array of integers, got {_describe(value)}"
            )
        for index, number in enumerate(numbers):
            if number is not None and not 0 <= number <= high:
                raise self.fail(key, f"entry {index} is {number}: expected 0 to {high}")
        return tuple(number or 0 for number in numbers)

    def too_long(self, key: str, value: SkippedArray) -> ModelFileError:
        return self.fail(key, f"has {value.count} entries, one per layer of at most {MAX_LAYERS}")

    @property
    def no_heads(self) -> str:
        return "" if self.recurrent else " (only a recurrent model, with ssm or wkv keys, has 0)"

    def pattern(self, block_count: int | None) -> tuple[bool, ...] | None:
        """The sliding-window pattern: an array of flags, or a period (every Pth is global)."""
        key = self.key("attention.sliding_window_pattern")
        if key not in self.meta:
            return None
        value = self.meta[key]
        if isinstance(value, SkippedArray):
            raise self.too_long(key, value)
        if not isinstance(value, list):
            period = self.check(key, value, 0, MAX_LAYERS)
            if not period or not block_count:
                return None
            return tuple((layer + 1) % period != 0 for layer in range(block_count))
        items = _flat(value)
        if not items or not all(isinstance(item, int) for item in items):
            raise self.fail(
                key, f"expected a period or an array of booleans, got {_describe(value)}"
            )
        return tuple(bool(item) for item in items)

    def entries(self, key: str) -> int | None:
        """How many entries an array key (a vocabulary, merge rules) has; None when absent."""
        if key not in self.meta:
            return None
        value = self.meta[key]
        if isinstance(value, SkippedArray):
            return value.count
        if isinstance(value, list):
            return len(value)
        raise self.fail(key, f"expected an array, got {_describe(value)}")


def _projector_size(mmproj: str | os.PathLike[str]) -> int:
    try:
        status = Path(mmproj).stat()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ModelFileError(f"{mmproj}: projector unreadable ({reason})") from None
    _refuse_irregular(mmproj, status.st_mode, "a projector file")
    return status.st_size


def read_geometry(
    path: str | os.PathLike[str], *, mmproj: str | os.PathLike[str] | None = None
) -> ModelGeometry:
    """The geometry of a GGUF model (and the size of its vision projector, if given).

    Read once per version of the files: a model whose file (and projector) is the same file,
    of the same size and modification time, as last read is not parsed again (a header's
    tokenizer arrays cost a tenth of a second of CPU on every start otherwise).

    Raises:
        ModelFileError: The file is missing, not a regular file, not GGUF, truncated, claims
            the impossible, or holds a value of the wrong type or past the ``MAX_*`` limits
            of :mod:`hostler.capacity.geometry` (one line naming the file and the key).
    """
    key = (_version_of(path), None if mmproj is None else _version_of(mmproj))
    if key[0] is None or (mmproj is not None and key[1] is None):
        return _read_geometry(path, mmproj=mmproj)  # unreadable: the parse says why
    return _cached_geometry(key, os.fspath(path), None if mmproj is None else os.fspath(mmproj))


_Version = tuple[str, int, int, int, int, bytes]
#: How much of a file's start is fingerprinted with its version (a rewrite within one tick
#: of the file system's clock keeps the modification time).
_FINGERPRINT = 64 * 1024


def _version_of(path: str | os.PathLike[str]) -> _Version | None:
    """Which file, at which version, ``path`` names now (None: not a regular file to read)."""
    file = Path(path)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO never blocks
    except (OSError, ValueError):
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return None
        start = os.pread(fd, _FINGERPRINT, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    digest = hashlib.blake2b(start, digest_size=16).digest()
    return (str(file), status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, digest)


@functools.lru_cache(maxsize=64)
def _cached_geometry(
    key: tuple[_Version | None, _Version | None], path: str, mmproj: str | None
) -> ModelGeometry:
    del key  # the cache's key: the files' versions
    return _read_geometry(path, mmproj=mmproj)


def _read_geometry(
    path: str | os.PathLike[str], *, mmproj: str | os.PathLike[str] | None = None
) -> ModelGeometry:
    file = Path(path)
    meta = read_metadata(file)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{file}: general.architecture: missing (not a model GGUF?)")
    if len(arch) > _SHOWN or not arch.isprintable():
        raise ModelFileError(
            f"{file}: general.architecture: '{_printable(arch)}' is not an architecture name"
        )
    fields = _Fields(file, meta, arch)
    count = fields.count
    block_count = count("block_count", 1, MAX_LAYERS)
    low = 0 if fields.recurrent else 1  # a recurrent model may have no attention at all
    mmproj_size = _projector_size(mmproj) if mmproj is not None else 0
    tokens = fields.entries("tokenizer.ggml.tokens")
    if tokens is not None and tokens > MAX_VOCAB:
        raise fields.fail("tokenizer.ggml.tokens", f"has {tokens} tokens (at most {MAX_VOCAB})")
    return ModelGeometry(
        architecture=arch,
        block_count=block_count,
        head_count=count("attention.head_count", low, MAX_HEADS, fields.no_heads),
        head_count_kv=fields.per_layer("attention.head_count_kv", MAX_HEADS),
        key_length=count("attention.key_length", low, MAX_HEAD_WIDTH),
        value_length=count("attention.value_length", low, MAX_HEAD_WIDTH),
        key_length_swa=count("attention.key_length_swa", low, MAX_HEAD_WIDTH),
        value_length_swa=count("attention.value_length_swa", low, MAX_HEAD_WIDTH),
        embedding_length=count("embedding_length", 1, MAX_EMBEDDING),
        sliding_window=count("attention.sliding_window", 0, MAX_CONTEXT_TOKENS),
        swa_pattern=fields.pattern(block_count),
        shared_kv_layers=count("attention.shared_kv_layers", 0, block_count or MAX_LAYERS) or 0,
        full_attention_interval=count("full_attention_interval", 0, MAX_LAYERS),
        ssm_inner_size=count("ssm.inner_size", 0, MAX_EMBEDDING),
        ssm_conv_kernel=count("ssm.conv_kernel", 0, MAX_EMBEDDING),
        ssm_state_size=count("ssm.state_size", 0, MAX_EMBEDDING),
        native_context=count("context_length", 1, MAX_CONTEXT_TOKENS),
        expert_count=count("expert_count", 0, MAX_EXPERTS),
        file_size=int(meta["__file_size__"]),
        tensor_bytes=int(meta["__tensor_data_bytes__"]),
        matmul_bytes=meta["__matmul_bytes__"],
        tensor_layout=meta["__layout__"],
        mmproj_size=mmproj_size,
        vocab_size=count("vocab_size", 0, MAX_VOCAB) or tokens,
        merge_count=fields.entries("tokenizer.ggml.merges") or 0,
    )
