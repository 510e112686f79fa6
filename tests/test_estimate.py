"""The footprint estimator's terms read from the header: repacked weights, vocabulary, merges."""

from __future__ import annotations

from pathlib import Path

from hostler.capacity import estimate
from hostler.capacity.estimate import estimate_llama
from hostler.capacity.gguf_header import read_geometry
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama


def test_matmul_weights_are_read_from_the_header(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "q4.gguf", TinyModel(weights="q4_0"))
    geometry = read_geometry(path)
    # per layer q 64x64, k 32x64, v 32x64, o 64x64, gate/up 128x64, down 64x128 = 36,864
    # elements; 2 layers + the output head (352 x 64) = 96,256 Q4_0 elements = 54,144 bytes.
    # The token embedding (a row lookup) is not a matrix product: not counted.
    assert geometry.matmul_bytes == (("q4_0", 54144),)
    repacked = estimate_llama(
        geometry, ctx_total=512, slots=1, kv_type="f16", repack_types={"q4_0"}
    )
    plain = estimate_llama(geometry, ctx_total=512, slots=1, kv_type="f16")
    assert repacked.repack == 54144
    # the output head (352 x 64 Q4_0 = 12,672 bytes) is the file's last tensor: once repacked
    # it leaves the mapping, which keeps the span from the first to the last tensor not repacked
    assert geometry.tensor_layout[-1] == ("q4_0", plain.weights - 12672, 12672, True)
    assert repacked.weights == plain.weights - 12672
    assert repacked.total == plain.total + 54144 - 12672


def test_a_bpe_vocabulary_prices_its_merge_table(tmp_path: Path) -> None:
    spm = read_geometry(write_tiny_llama(tmp_path / "spm.gguf", TinyModel(vocab=2000)))
    bpe = read_geometry(
        write_tiny_llama(tmp_path / "bpe.gguf", TinyModel(vocab=2000, tokenizer="gpt2"))
    )
    assert (spm.vocab_size, spm.merge_count) == (2000, 0)
    assert (bpe.vocab_size, bpe.merge_count) == (2000, 1741)  # every multi-character token
    runtime = estimate_llama(bpe, ctx_total=512, slots=1, kv_type="f16").runtime
    assert runtime == (
        estimate.RUNTIME_FIXED
        + 2000 * estimate.RUNTIME_PER_TOKEN
        + 1741 * estimate.RUNTIME_PER_MERGE
    )


def test_the_fitted_runtime_constants() -> None:
    """Fitted in bench/estimate.py on its fitting set (docs/benchmarks.md); pinned here."""
    assert estimate.RUNTIME_FIXED == 29 * 1024 * 1024
    assert estimate.RUNTIME_PER_TOKEN == 173
    assert estimate.RUNTIME_PER_MERGE == 171
