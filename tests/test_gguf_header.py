"""Reading geometry from real GGUF files written with the `gguf` package, and refusing bad ones."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from hostler.capacity.gguf_header import SkippedArray, read_geometry, read_metadata
from hostler.capacity.kv import full_attention_kv, windowed_linearization
from hostler.errors import ModelFileError


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
