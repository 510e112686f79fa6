"""Reading geometry from real GGUF files written with the `gguf` package, and refusing bad ones."""

from __future__ import annotations

import math
import os
import struct
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from hostler.capacity.geometry import MAX_LAYERS, ModelGeometry
from hostler.capacity.gguf_header import SkippedArray, read_geometry, read_metadata
from hostler.capacity.kv import full_attention_kv, windowed_linearization
from hostler.cli import main
from hostler.errors import ModelFileError

from _support import run_cli


def write_gguf(
    path: Path, arch: str, fill: Callable[[gguf.GGUFWriter], None], *, vocab: int = 0
) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    fill(writer)
    if vocab:
        writer.add_token_list([f"tok{i}" for i in range(vocab)])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama(writer: gguf.GGUFWriter) -> None:
    writer.add_block_count(32)
    writer.add_context_length(131072)
    writer.add_embedding_length(4096)
    writer.add_head_count(32)
    writer.add_head_count_kv(8)


def test_llama_geometry(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "llama.gguf", "llama", llama, vocab=50_000)
    geometry = read_geometry(path)
    assert geometry.architecture == "llama"
    assert (geometry.block_count, geometry.head_count, geometry.head_count_kv) == (32, 32, 8)
    assert geometry.embedding_length == 4096
    assert geometry.native_context == 131072
    assert geometry.file_size == path.stat().st_size
    assert not geometry.is_moe
    assert geometry.vocab_size == 50_000
    assert full_attention_kv(geometry, 1, "f16") == 131072


def test_gemma_like_sliding_window_geometry(tmp_path: Path) -> None:
    def gemma(writer: gguf.GGUFWriter) -> None:
        writer.add_block_count(6)
        writer.add_context_length(32768)
        writer.add_embedding_length(1152)
        writer.add_head_count(4)
        writer.add_head_count_kv(1)
        writer.add_key_length(256)
        writer.add_value_length(256)
        writer.add_sliding_window(512)
        writer.add_sliding_window_pattern([True, True, True, True, True, False])

    geometry = read_geometry(write_gguf(tmp_path / "g.gguf", "gemma3", gemma))
    assert geometry.swa_pattern == (True, True, True, True, True, False)
    assert geometry.sliding_window == 512
    line = windowed_linearization(geometry, "f16")
    assert line is not None
    assert line.per_token == 1 * 512 * 2
    assert line.fixed == 5 * 1 * 512 * 2 * (512 + 2048)


def test_moe_per_layer_heads_and_projector(tmp_path: Path) -> None:
    def moe(writer: gguf.GGUFWriter) -> None:
        writer.add_block_count(3)
        writer.add_embedding_length(512)
        writer.add_head_count(8)
        writer.add_head_count_kv([2, 4, 2])
        writer.add_expert_count(8)
        writer.add_full_attention_interval(4)

    projector = tmp_path / "mmproj.gguf"
    projector.write_bytes(b"\0" * 1234)
    geometry = read_geometry(write_gguf(tmp_path / "m.gguf", "qwen3moe", moe), mmproj=projector)
    assert geometry.head_count_kv == (2, 4, 2)
    assert geometry.is_moe
    assert geometry.full_attention_interval == 4
    assert geometry.mmproj_size == 1234


def test_metadata_skips_long_arrays_without_decoding_them(tmp_path: Path) -> None:
    meta = read_metadata(write_gguf(tmp_path / "v.gguf", "llama", llama, vocab=20_000))
    assert meta["tokenizer.ggml.tokens"] == SkippedArray(20_000)
    assert meta["llama.block_count"] == 32


def _broken(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _header(kv_count: int, tensors: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, kv_count)


def _kv_string(key: str, value_len: int, actual: bytes) -> bytes:
    k = key.encode()
    return (
        struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", value_len) + actual
    )


BROKEN = {
    "wrong_magic": (b"GGML" + b"\0" * 100, "magic"),
    "too_short": (b"GGUF\x03", "too short"),
    "bad_version": (b"GGUF" + struct.pack("<IQQ", 99, 0, 0) + b"\0" * 32, "version"),
    "absurd_kv_count": (_header(2**62) + b"\0" * 64, "kv_count"),
    "absurd_tensor_count": (_header(0, 2**60) + b"\0" * 64, "tensor_count"),
    "absurd_string": (
        _header(1) + _kv_string("general.architecture", 2**40, b"llama"),
        "general.architecture",
    ),
    "absurd_key": (_header(1) + struct.pack("<Q", 2**50) + b"x" * 64, "key #0"),
    "absurd_array": (
        _header(1)
        + struct.pack("<Q", 3)
        + b"abc"
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 6, 2**61)
        + b"\0" * 64,
        "abc",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_fail_fast_with_the_file_and_field_named(tmp_path: Path, case: str) -> None:
    data, field = BROKEN[case]
    path = _broken(tmp_path, f"{case}.gguf", data)
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(ModelFileError) as caught:
        read_geometry(path)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert field in message
    assert "\n" not in message
    assert elapsed < 0.1
    assert peak < 1024 * 1024  # nothing allocated from the header's claims
    assert caught.value.code == "model.unreadable"


def test_truncated_real_model(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf", "llama", llama, vocab=1000)
    data = good.read_bytes()
    cut = _broken(tmp_path, "cut.gguf", data[: len(data) // 3])
    with pytest.raises(ModelFileError) as caught:
        read_geometry(cut)
    message = str(caught.value)
    assert message.startswith(f"{cut}: tokenizer.ggml.tokens: ")
    assert "cannot hold" in message or "truncated" in message


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such model file"):
        read_geometry(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="is a directory"):
        read_geometry(tmp_path)


def test_a_gguf_without_architecture(tmp_path: Path) -> None:
    path = tmp_path / "noarch.gguf"
    path.write_bytes(_header(0, 0) + b"\0" * 64)
    with pytest.raises(ModelFileError, match=r"general\.architecture: missing"):
        read_geometry(path)


# -- hostile headers (issue "Bad input and broken storage", part 3) --------------------------
#
# Each case was a traceback, a silent misreading or a hang on main. The reader must refuse it in
# one line naming the file and the key, fast, before allocating or looping on its claims.

T = gguf.GGUFValueType
#: The valid llama header every hostile case starts from (key suffix → value, GGUF type).
BASE: dict[str, tuple[Any, ...]] = {
    "block_count": (32, T.UINT32),
    "context_length": (131072, T.UINT32),
    "embedding_length": (4096, T.UINT32),
    "attention.head_count": (32, T.UINT32),
    "attention.head_count_kv": (8, T.UINT32),
}


def hostile(path: Path, arch: str = "llama", /, **changes: tuple[Any, ...] | None) -> Path:
    """A real GGUF written by ``gguf``: the BASE keys with ``changes`` (None removes a key).

    Keys are ``ARCH.`` suffixes with ``__`` for dots; a key starting ``general__`` or
    ``tokenizer__`` is taken as it is.
    """
    writer = gguf.GGUFWriter(str(path), arch)
    keys = {k.replace("__", "."): v for k, v in changes.items()}
    for suffix, spec in {**BASE, **keys}.items():
        if spec is None:
            continue
        key = suffix if suffix.startswith(("general.", "tokenizer.")) else f"{arch}.{suffix}"
        writer.add_key_value(key, *spec)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _kv(key: str, kind: int, payload: bytes) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", kind) + payload


def _arch(name: bytes = b"llama") -> bytes:
    return _kv("general.architecture", 8, struct.pack("<Q", len(name)) + name)


def _nested(depth: int) -> bytes:
    """An array of one array of ... of one uint32, ``depth`` arrays deep."""
    payload = struct.pack("<IQI", 4, 1, 7)
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", 9, 1) + payload
    return payload


def _tensor_info(name: bytes, shape: tuple[int, ...], kind: int = 0, offset: int = 0) -> bytes:
    dims = struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
    return struct.pack("<Q", len(name)) + name + dims + struct.pack("<IQ", kind, offset)


#: name → (how to build it, the key the message names, words it carries)
HOSTILE: dict[str, tuple[Callable[[Path], Path], str, str]] = {
    "nan_heads": (
        lambda p: hostile(p, attention__head_count=(math.nan, T.FLOAT32)),
        "llama.attention.head_count",
        "expected an integer, got NaN",
    ),
    "inf_width": (
        lambda p: hostile(p, embedding_length=(math.inf, T.FLOAT64)),
        "llama.embedding_length",
        "expected an integer, got infinity",
    ),
    "minus_inf_context": (
        lambda p: hostile(p, context_length=(-math.inf, T.FLOAT32)),
        "llama.context_length",
        "expected an integer, got -infinity",
    ),
    "fraction": (
        lambda p: hostile(p, attention__head_count=(1.5, T.FLOAT32)),
        "llama.attention.head_count",
        "expected an integer, got 1.5",
    ),
    "string_layers": (
        lambda p: hostile(p, block_count=("32", T.STRING)),
        "llama.block_count",
        "expected an integer, got a string",
    ),
    "string_array_layers": (
        lambda p: hostile(p, block_count=(["3", "2"], T.ARRAY, T.STRING)),
        "llama.block_count",
        "expected an integer, got an array of strings",
    ),
    "bool_layers": (
        lambda p: hostile(p, block_count=(True, T.BOOL)),
        "llama.block_count",
        "expected an integer, got a boolean",
    ),
    "string_array_kv_heads": (
        lambda p: hostile(p, attention__head_count_kv=(["8", "8"], T.ARRAY, T.STRING)),
        "llama.attention.head_count_kv",
        "expected an integer or an array of integers, got an array of strings",
    ),
    "nan_in_kv_heads": (
        lambda p: hostile(p, attention__head_count_kv=([8.0, math.nan], T.ARRAY, T.FLOAT32)),
        "llama.attention.head_count_kv",
        "got an array of floats (entry 1 is NaN)",
    ),
    "kv_heads_entry_too_big": (
        lambda p: hostile(p, attention__head_count_kv=([8, 5000], T.ARRAY, T.UINT32)),
        "llama.attention.head_count_kv",
        "entry 1 is 5000: expected 0 to 4096",
    ),
    "kv_heads_more_entries_than_layers_allowed": (
        lambda p: hostile(p, attention__head_count_kv=([8] * 5000, T.ARRAY, T.UINT32)),
        "llama.attention.head_count_kv",
        "has 5000 entries, one per layer of at most 4096",
    ),
    "block_count_4294967295": (
        lambda p: hostile(
            p,
            block_count=(4294967295, T.UINT32),
            attention__sliding_window_pattern=(4, T.UINT32),
        ),
        "llama.block_count",
        "4294967295 is out of range: expected 1 to 4096",
    ),
    "width_overflows_a_float": (
        lambda p: hostile(p, embedding_length=(1e308, T.FLOAT64)),
        "llama.embedding_length",
        "1e+308 is out of range: expected 1 to 1048576",
    ),
    "count_past_uint64_floats": (
        lambda p: hostile(p, attention__key_length=(2**64 - 1, T.UINT64)),
        "llama.attention.key_length",
        "18446744073709551615 is out of range: expected 1 to 65536",
    ),
    "negative_kv_heads": (
        lambda p: hostile(p, attention__head_count_kv=(-8, T.INT32)),
        "llama.attention.head_count_kv",
        "-8 is out of range: expected 1 to 4096",
    ),
    "negative_layers": (
        lambda p: hostile(p, block_count=(-1, T.INT64)),
        "llama.block_count",
        "-1 is out of range: expected 1 to 4096",
    ),
    "zero_heads": (
        lambda p: hostile(p, attention__head_count=(0, T.UINT32)),
        "llama.attention.head_count",
        "0 is out of range: expected 1 to 4096 (only a recurrent model",
    ),
    "zero_kv_heads": (
        lambda p: hostile(p, attention__head_count_kv=(0, T.UINT32)),
        "llama.attention.head_count_kv",
        "0 is out of range: expected 1 to 4096",
    ),
    "zero_layers": (
        lambda p: hostile(p, block_count=(0, T.UINT32)),
        "llama.block_count",
        "0 is out of range: expected 1 to 4096",
    ),
    "zero_context": (
        lambda p: hostile(p, context_length=(0, T.UINT32)),
        "llama.context_length",
        "0 is out of range: expected 1 to 4294967295",
    ),
    "more_shared_layers_than_layers": (
        lambda p: hostile(p, attention__shared_kv_layers=(33, T.UINT32)),
        "llama.attention.shared_kv_layers",
        "33 is out of range: expected 0 to 32",
    ),
    "string_array_pattern": (
        lambda p: hostile(p, attention__sliding_window_pattern=(["x"], T.ARRAY, T.STRING)),
        "llama.attention.sliding_window_pattern",
        "expected a period or an array of booleans, got an array of strings",
    ),
    "huge_period": (
        lambda p: hostile(p, attention__sliding_window_pattern=(2**40, T.UINT64)),
        "llama.attention.sliding_window_pattern",
        "1099511627776 is out of range: expected 0 to 4096",
    ),
    "vocab_past_int32": (
        lambda p: hostile(p, vocab_size=(2**31, T.UINT32)),
        "llama.vocab_size",
        "2147483648 is out of range: expected 0 to 2147483647",
    ),
    "tokens_not_an_array": (
        lambda p: hostile(p, tokenizer__ggml__tokens=("abc", T.STRING)),
        "tokenizer.ggml.tokens",
        "expected an array, got a string",
    ),
    "alignment_not_a_power_of_two": (
        lambda p: hostile(p, general__alignment=(48, T.UINT32)),
        "general.alignment",
        "expected a power of two, got 48",
    ),
    "architecture_with_a_newline": (
        lambda p: hostile(p, general__architecture=("lla\nma", T.STRING)),
        "general.architecture",
        "'lla\\nma' is not an architecture name",
    ),
    "huge_array_length": (
        lambda p: _broken(
            p.parent,
            p.name,
            _header(2, 0)
            + _arch()
            + _kv("llama.attention.head_count_kv", 9, struct.pack("<IQ", 4, 2**62))
            + b"\0" * 64,
        ),
        "llama.attention.head_count_kv",
        "claims 4611686018427387904 elements; the file cannot hold them",
    ),
    "huge_string_array_length": (
        lambda p: _broken(
            p.parent,
            p.name,
            _header(2, 0)
            + _arch()
            + _kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**63))
            + b"\0" * 64,
        ),
        "tokenizer.ggml.tokens",
        "claims 9223372036854775808 strings; the file cannot hold them",
    ),
    "huge_string_length": (
        lambda p: _broken(
            p.parent,
            p.name,
            _header(2, 0) + _arch() + _kv("general.name", 8, struct.pack("<Q", 2**64 - 1)),
        ),
        "general.name",
        "needs 18446744073709551615 bytes",
    ),
    "arrays_nested_too_deep": (
        lambda p: _broken(
            p.parent, p.name, _header(2, 0) + _arch() + _kv("deep", 9, _nested(5)) + b"\0" * 8
        ),
        "deep",
        "arrays nested more than 4 deep",
    ),
    "a_key_with_a_newline": (
        lambda p: _broken(p.parent, p.name, _header(1, 0) + _kv("a\nb", 99, b"") + b"\0" * 32),
        "a\\nb",
        "unknown value type 99",
    ),
    "tensor_bigger_than_the_file": (
        lambda p: _broken(
            p.parent,
            p.name,
            _header(1, 1) + _arch() + _tensor_info(b"token_embd.weight", (2**40, 2**40)),
        ),
        "tensor token_embd.weight",
        "claims 4835703278458516698824704 bytes at offset 0 of a data section of 0 bytes",
    ),
    "tensor_past_the_end": (
        lambda p: _broken(
            p.parent,
            p.name,
            _header(1, 1) + _arch() + _tensor_info(b"w", (8,), offset=2**64 - 1) + b"\0" * 64,
        ),
        "tensor w",
        "claims 32 bytes at offset 18446744073709551615",
    ),
}


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


#: Files that are not regular: each refused from its stat, never opened to wait on.
NOT_REGULAR: dict[str, tuple[Callable[[Path], Path], str]] = {
    "fifo": (_fifo, "is a FIFO (named pipe), not a model file"),
    "directory": (_folder, "is a directory, not a model file"),
    "link_to_a_fifo": (
        lambda p: _symlink(p, _fifo(p.with_suffix(".pipe"))),
        "is a FIFO (named pipe), not a model file",
    ),
    "device": (lambda _: Path("/dev/null"), "is a character device, not a model file"),
}


def _symlink(path: Path, target: Path) -> Path:
    path.symlink_to(target)
    return path


def _refusal(path: Path, run: Callable[[], object]) -> tuple[str, float]:
    started = time.perf_counter()
    with pytest.raises(ModelFileError) as caught:
        run()
    elapsed = time.perf_counter() - started
    assert caught.value.code == "model.unreadable"
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    return message, elapsed


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_header_is_refused_in_one_line_naming_the_key(tmp_path: Path, case: str) -> None:
    build, key, words = HOSTILE[case]
    path = build(tmp_path / f"{case}.gguf")
    tracemalloc.start()
    message, elapsed = _refusal(path, lambda: read_geometry(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert message.startswith(f"{path}: {key}: "), message
    assert words in message, message
    assert elapsed < 0.5
    assert peak < 2 * 1024 * 1024  # nothing allocated from the header's claims


@pytest.mark.parametrize("case", sorted(NOT_REGULAR))
def test_a_file_that_is_not_regular_is_refused_without_waiting(tmp_path: Path, case: str) -> None:
    build, words = NOT_REGULAR[case]
    path = build(tmp_path / f"{case}.gguf")
    message, elapsed = _refusal(path, lambda: read_geometry(path))
    assert message == f"{path}: {words}"
    assert elapsed < 0.5


def test_a_projector_that_is_not_regular_is_refused(tmp_path: Path) -> None:
    model = hostile(tmp_path / "m.gguf")
    pipe = _fifo(tmp_path / "mmproj.gguf")
    message, _ = _refusal(pipe, lambda: read_geometry(model, mmproj=pipe))
    assert message == f"{pipe}: is a FIFO (named pipe), not a projector file"
    gone = tmp_path / "nope.gguf"
    message, _ = _refusal(gone, lambda: read_geometry(model, mmproj=gone))
    assert message == f"{gone}: projector unreadable (No such file or directory)"


def test_an_empty_regular_file_is_too_short(tmp_path: Path) -> None:
    path = _broken(tmp_path, "empty.gguf", b"")
    message, _ = _refusal(path, lambda: read_geometry(path))
    assert message == f"{path}: header: 0 bytes is too short for a GGUF model"


def test_a_recurrent_model_may_have_no_attention_heads(tmp_path: Path) -> None:
    """Mamba and RWKV headers say 0 heads (llama.cpp's converters write it); they are models."""
    path = hostile(
        tmp_path / "mamba.gguf",
        "mamba",
        attention__head_count=(0, T.UINT32),
        attention__head_count_kv=None,
        ssm__conv_kernel=(4, T.UINT32),
        ssm__inner_size=(1536, T.UINT32),
        ssm__state_size=(16, T.UINT32),
    )
    geometry = read_geometry(path)
    assert (geometry.block_count, geometry.head_count, geometry.ssm_state_size) == (32, 0, 16)
    hybrid = hostile(
        tmp_path / "jamba.gguf",
        "jamba",
        attention__head_count_kv=([0, 8] * 16, T.ARRAY, T.UINT32),
        ssm__state_size=(16, T.UINT32),
    )
    assert read_geometry(hybrid).head_count_kv == (0, 8) * 16


def test_integral_floats_are_read_as_integers(tmp_path: Path) -> None:
    path = hostile(tmp_path / "f.gguf", attention__head_count=(32.0, T.FLOAT32))
    assert read_geometry(path).head_count == 32


def test_a_tensor_that_ends_exactly_at_the_end_of_the_data_is_read(tmp_path: Path) -> None:
    """The tensor bound is inclusive: the last tensor of a real file ends at (or before) EOF."""
    data = _header(1, 1) + _arch() + _tensor_info(b"w", (8,))
    data += b"\0" * (-len(data) % 32)
    path = _broken(tmp_path, "exact.gguf", data + b"\0" * 32)
    assert read_geometry(path).tensor_bytes == 32
    short = _broken(tmp_path, "short.gguf", data + b"\0" * 31)
    message, _ = _refusal(short, lambda: read_geometry(short))
    assert "tensor w: claims 32 bytes at offset 0 of a data section of 31 bytes" in message


def test_arrays_nested_to_the_limit_are_read(tmp_path: Path) -> None:
    path = _broken(
        tmp_path, "n.gguf", _header(2, 0) + _arch() + _kv("deep", 9, _nested(4)) + b"\0" * 8
    )
    assert read_metadata(path)["deep"] is None  # stepped over, not decoded


#: (key suffix, GGUF type, the largest value accepted, the smallest refused above it)
LIMITS = [
    ("block_count", T.UINT32, 4096, 4097),
    ("attention.head_count", T.UINT32, 4096, 4097),
    ("attention.head_count_kv", T.UINT32, 4096, 4097),
    ("attention.key_length", T.UINT32, 65536, 65537),
    ("attention.value_length_swa", T.UINT32, 65536, 65537),
    ("embedding_length", T.UINT32, 1_048_576, 1_048_577),
    ("context_length", T.UINT64, 2**32 - 1, 2**32),
    ("attention.sliding_window", T.UINT64, 2**32 - 1, 2**32),
    ("expert_count", T.UINT32, 65536, 65537),
    ("vocab_size", T.UINT32, 2**31 - 1, 2**31),
    ("full_attention_interval", T.UINT32, 4096, 4097),
    ("ssm.state_size", T.UINT32, 1_048_576, 1_048_577),
    ("attention.sliding_window_pattern", T.UINT32, 4096, 4097),
]


@pytest.mark.parametrize(("suffix", "kind", "limit", "refused"), LIMITS)
def test_each_limit_is_accepted_and_one_more_refused(
    tmp_path: Path, suffix: str, kind: gguf.GGUFValueType, limit: int, refused: int
) -> None:
    key = suffix.replace(".", "__")
    read_geometry(hostile(tmp_path / "at.gguf", **{key: (limit, kind)}))
    over = hostile(tmp_path / "over.gguf", **{key: (refused, kind)})
    message, _ = _refusal(over, lambda: read_geometry(over))
    assert message.startswith(f"{over}: llama.{suffix}: {refused} is out of range: expected ")
    assert message.endswith(f" to {limit}")


def test_per_layer_arrays_of_4096_are_read_and_4097_refused(tmp_path: Path) -> None:
    layers = (4096, T.UINT32)
    at = hostile(
        tmp_path / "at.gguf",
        block_count=layers,
        attention__head_count_kv=([8] * 4096, T.ARRAY, T.UINT32),
        attention__sliding_window_pattern=([True, False] * 2048, T.ARRAY, T.BOOL),
        attention__sliding_window=(512, T.UINT32),
    )
    geometry = read_geometry(at)
    assert geometry.head_count_kv == (8,) * 4096
    assert geometry.swa_pattern is not None and len(geometry.swa_pattern) == 4096
    line = windowed_linearization(geometry, "f16")  # walks all 4096 layers, quickly
    assert line is not None and line.per_token > 0
    for key, spec in (
        ("attention__head_count_kv", ([8] * 4097, T.ARRAY, T.UINT32)),
        ("attention__sliding_window_pattern", ([True] * 4097, T.ARRAY, T.BOOL)),
    ):
        over = hostile(tmp_path / f"{key}.gguf", block_count=layers, **{key: spec})
        message, _ = _refusal(over, lambda path=over: read_geometry(path))  # type: ignore[misc]
        assert message.endswith(": has 4097 entries, one per layer of at most 4096"), message


def test_a_hand_built_geometry_past_the_layer_limit_is_never_walked() -> None:
    """The pure KV pricing does not trust its caller either: past 4096 layers it prices none."""
    huge = ModelGeometry(
        block_count=4294967295,
        head_count=32,
        head_count_kv=8,
        embedding_length=4096,
        swa_pattern=None,
        full_attention_interval=4,
    )
    started = time.perf_counter()
    assert full_attention_kv(huge, 4096, "f16") is None
    assert full_attention_kv(replace(huge, block_count=MAX_LAYERS), 1, "f16") is not None
    assert time.perf_counter() - started < 0.5


# -- the same through `hostler preview` ---------------------------------------------------------

CLI_CASES = [
    "block_count_4294967295",
    "string_array_kv_heads",
    "nan_heads",
    "width_overflows_a_float",
    "huge_array_length",
]


@pytest.mark.parametrize("case", CLI_CASES)
def test_preview_of_a_hostile_header_is_one_line_exit_1_and_fast(tmp_path: Path, case: str) -> None:
    build, key, words = HOSTILE[case]
    path = build(tmp_path / f"{case}.gguf")
    started = time.perf_counter()
    result = run_cli("preview", str(path), "--ledger", str(tmp_path / "ledger.db"), timeout=30)
    elapsed = time.perf_counter() - started
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"hostler: error [model.unreadable]: {path}: {key}: "), lines[0]
    assert words in lines[0]
    assert elapsed < 10  # an interpreter's start on a busy machine; it was over a minute


@pytest.mark.parametrize("case", ["fifo", "directory"])
def test_preview_of_a_fifo_or_directory_does_not_block(tmp_path: Path, case: str) -> None:
    build, words = NOT_REGULAR[case]
    path = build(tmp_path / f"{case}.gguf")
    result = run_cli("preview", str(path), "--ledger", str(tmp_path / "ledger.db"), timeout=30)
    assert result.returncode == 1
    assert result.stderr == f"hostler: error [model.unreadable]: {path}: {words}\n"


def test_preview_refuses_4294967295_layers_in_under_2_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 4.4 KB header that made preview run for a minute and ask for ~34 GB (in-process)."""
    build, _, _ = HOSTILE["block_count_4294967295"]
    path = build(tmp_path / "layers.gguf")
    started = time.perf_counter()
    status = main(["preview", str(path), "--ledger", str(tmp_path / "ledger.db")])
    assert time.perf_counter() - started < 2
    assert status == 1
    assert capsys.readouterr().err == (
        f"hostler: error [model.unreadable]: {path}: llama.block_count: 4294967295 is out of "
        "range: expected 1 to 4096\n"
    )


def test_a_model_is_parsed_once_per_version_of_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/control_plane.py: every start re-read a 49k-token header (0.1 CPU-s a swap)."""
    import hostler.capacity.gguf_header as header

    path = write_gguf(tmp_path / "llama.gguf", "llama", llama, vocab=1000)
    parsed: list[Path] = []
    real = header.read_metadata

    def counted(file: Path) -> dict[str, Any]:
        parsed.append(file)
        return real(file)

    monkeypatch.setattr(header, "read_metadata", counted)
    first = read_geometry(path)
    assert read_geometry(path) is first and len(parsed) == 1  # the same file: not again

    def fewer_layers(writer: gguf.GGUFWriter) -> None:
        llama(writer)
        writer.add_block_count(16)

    stamp = path.stat().st_mtime_ns
    write_gguf(path, "llama", fewer_layers, vocab=1000)  # same size, rewritten in place
    os.utime(path, ns=(stamp, stamp))  # even within one tick of the file system's clock
    assert read_geometry(path).block_count == 16 and len(parsed) == 2
    path.unlink()
    with pytest.raises(ModelFileError):
        read_geometry(path)  # gone: said as before, never an old answer
