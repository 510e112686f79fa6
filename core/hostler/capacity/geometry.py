"""Model geometry: the facts of a model's shape that price its KV cache (pure data)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MAX_CONTEXT_TOKENS",
    "MAX_EMBEDDING",
    "MAX_EXPERTS",
    "MAX_HEADS",
    "MAX_HEAD_WIDTH",
    "MAX_LAYERS",
    "MAX_VOCAB",
    "ModelGeometry",
]

#: The most layers a model may have: llama.cpp itself stops at 512 (``LLAMA_MAX_LAYERS``); the
#: largest released models have under 200. The planner walks the layers, so this bounds it.
MAX_LAYERS = 4096
#: The most attention heads (or KV heads) a layer may have (released models: at most 128).
MAX_HEADS = 4096
#: The widest a head may be, in elements (released models: at most 576).
MAX_HEAD_WIDTH = 65_536
#: The widest a model (and a linear-attention state) may be (released models: under 32,768).
MAX_EMBEDDING = 1_048_576
#: The most experts a mixture may route through (llama.cpp stops at 512).
MAX_EXPERTS = 65_536
#: The longest native context or sliding window: llama.cpp reads them as 32-bit unsigned.
MAX_CONTEXT_TOKENS = 2**32 - 1
#: The largest vocabulary: llama.cpp's token ids are 32-bit signed.
MAX_VOCAB = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """What a model's header says about its shape (None where it says nothing).

    The GGUF reader never yields a geometry past the ``MAX_*`` limits above; the KV pricing
    treats one built by hand past :data:`MAX_LAYERS` as unreadable (it never walks it).

    Attributes:
        architecture: ``general.architecture`` (``llama``, ``gemma3``, ``qwen3moe``...).
        block_count: Transformer layers.
        head_count: Attention (query) heads.
        head_count_kv: KV heads, one number or one per layer.
        key_length: Per-head key width of global layers (default embedding / heads).
        value_length: Per-head value width of global layers.
        key_length_swa: Per-head key width of sliding-window layers.
        value_length_swa: Per-head value width of sliding-window layers.
        embedding_length: Model width.
        sliding_window: Window of SWA layers, in tokens.
        swa_pattern: Per layer, True where the layer is sliding-window.
        shared_kv_layers: Trailing layers that reuse earlier layers' KV (own none).
        full_attention_interval: In a linear-attention hybrid, every Nth layer is full.
        ssm_inner_size: Linear-attention state width (hybrids).
        ssm_conv_kernel: Linear-attention convolution kernel (hybrids).
        ssm_state_size: Linear-attention state size (hybrids).
        native_context: The context the model was trained for.
        expert_count: Experts (MoE); None or 0 for a dense model.
        file_size: Bytes of the model file.
        mmproj_size: Bytes of its vision projector, if any.
        vocab_size: Tokens in the vocabulary (the tokenizer's runtime tables grow with it).
        merge_count: BPE merge rules (``tokenizer.ggml.merges``; 0 for other tokenizers): the
            tokenizer keeps a table of them in memory too.
        tensor_bytes: Bytes of tensor data (the file without its header), when known.
        matmul_bytes: Bytes of the weights that matrix products read (every tensor of two or
            more dimensions but the token embedding; the embedding too when the output head is
            tied to it), per tensor type (``q4_0``, ``f16``...): what a CPU backend may repack.
        tensor_layout: Every tensor's ``(type, offset in the data section, bytes, read by
            matrix products)``, in file order (empty when unknown): which part of the file a
            backend keeps mapped once it repacks some weights.
    """

    architecture: str = ""
    block_count: int | None = None
    head_count: int | None = None
    head_count_kv: int | tuple[int, ...] | None = None
    key_length: int | None = None
    value_length: int | None = None
    key_length_swa: int | None = None
    value_length_swa: int | None = None
    embedding_length: int | None = None
    sliding_window: int | None = None
    swa_pattern: tuple[bool, ...] | None = None
    shared_kv_layers: int = 0
    full_attention_interval: int | None = None
    ssm_inner_size: int | None = None
    ssm_conv_kernel: int | None = None
    ssm_state_size: int | None = None
    native_context: int | None = None
    expert_count: int | None = None
    file_size: int = 0
    mmproj_size: int = 0
    vocab_size: int | None = None
    merge_count: int = 0
    tensor_bytes: int | None = None
    matmul_bytes: tuple[tuple[str, int], ...] = ()
    tensor_layout: tuple[tuple[str, int, int, bool], ...] = ()

    @property
    def is_moe(self) -> bool:
        """Whether the model routes through experts."""
        return bool(self.expert_count and self.expert_count > 1)
