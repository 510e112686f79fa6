"""What a llama.cpp engine will really occupy, before it ever ran (pure).

The estimate adds the parts ``llama-server`` allocates, each from the model's header:

* **weights**: the model buffer, the tensor data of the file (mapped; on a discrete card, VRAM);
* **KV cache**: exact from geometry, over the cells the server really allocates: with
  ``--parallel N`` each sequence gets ``ctx / N`` cells, padded to 256 and never under 256
  (so the KV grows with the *total* ``--ctx-size``, not ``ctx × parallel``);
* **compute buffer**: the graph's scratch, mostly a fixed block plus the f16 attention mask of
  one micro-batch against a sequence's cells;
* **runtime**: the process itself, plus tokenizer tables that grow with the vocabulary.

Constants are those of the llama.cpp CPU backend (build b1-7e4c0a9, measured in
``bench/estimate.py``); the learning loop (:mod:`hostler.capacity.learning`) corrects what is
left for each model and build after its first launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.kv import exact_linearization, heuristic_per_slot_kv
from hostler.capacity.units import MIB

__all__ = ["LlamaFootprint", "estimate_llama", "kv_cells"]

CELL_PAD = 256
MIN_CELLS_PER_SEQUENCE = 256
MICRO_BATCH = 512
COMPUTE_FIXED = 13 * MIB
RUNTIME_FIXED = 17 * MIB
RUNTIME_PER_TOKEN = 350  # bytes of tokenizer tables per vocabulary entry


@dataclass(frozen=True, slots=True)
class LlamaFootprint:
    """An estimate, by part (bytes)."""

    weights: int
    kv: int
    compute: int
    runtime: int

    @property
    def total(self) -> int:
        """Everything the process will hold."""
        return self.weights + self.kv + self.compute + self.runtime


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
) -> LlamaFootprint:
    """The footprint of ``llama-server -c ctx_total -np slots`` with this model."""
    per_sequence, cells = kv_cells(ctx_total, slots, unified=unified_kv)
    line = exact_linearization(geometry, kv_type)
    if line is not None:
        sequences = 1 if unified_kv else max(1, slots)
        kv = round(line.per_token * cells + line.fixed * sequences)
    else:
        kv = heuristic_per_slot_kv(geometry.file_size, cells, kv_type)
    compute = COMPUTE_FIXED + per_sequence * MICRO_BATCH * 2
    runtime = RUNTIME_FIXED + (geometry.vocab_size or 0) * RUNTIME_PER_TOKEN
    weights = geometry.file_size + geometry.mmproj_size
    return LlamaFootprint(weights=weights, kv=kv, compute=compute, runtime=runtime)
