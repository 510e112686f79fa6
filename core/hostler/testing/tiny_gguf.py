"""Write tiny random-weight llama GGUF models that the real ``llama-server`` loads.

Useful wherever a test or a benchmark needs a real model file of a chosen size and shape: it
loads in well under a second, answers deterministically at temperature 0 (nonsense, but
printable), and its header carries real geometry for the capacity planner.

Command line: ``python -m hostler.testing.tiny_gguf OUT.gguf [--layers N --embd N ...]``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

__all__ = ["WEIGHT_TYPES", "TinyModel", "write_tiny_llama"]

#: Matrix types a generated model may store, by name. ``q4_k`` and ``iq4_nl`` have no numpy
#: quantizer in ``gguf``: their blocks are random bytes under small, sane scales (they load,
#: and price memory like real ones; their answers are noise).
WEIGHT_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_k": gguf.GGMLQuantizationType.Q4_K,
    "iq4_nl": gguf.GGMLQuantizationType.IQ4_NL,
}
_RANDOM_BLOCKS = {"q4_k", "iq4_nl"}
_FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "iq4_nl": gguf.LlamaFileType.MOSTLY_IQ4_NL,
}

_WORDS = [
    "▁",
    "▁the",
    "▁a",
    "▁is",
    "▁of",
    "▁and",
    "▁to",
    "▁in",
    "▁hello",
    "▁world",
    "▁capital",
    "▁France",
    "▁Paris",
    "▁cat",
    "▁dog",
    ".",
]


@dataclass(frozen=True, slots=True)
class TinyModel:
    """The shape of a generated model.

    Attributes:
        weights: The matrices' type (a :data:`WEIGHT_TYPES` name); empty: ``f16`` if
            ``f16`` else ``f32``. Quantized types need ``embd`` and ``ff`` multiples of the
            block (32; 256 for ``q4_k``). The token embedding and output head of a model with
            random-block weights are stored as ``q8_0``.
        vocab: Pad the vocabulary with distinct filler tokens up to this many (0: the
            built-in ~350 tokens).
        tokenizer: ``llama`` (SentencePiece with byte fallback, no merges) or ``gpt2``
            (byte-level BPE: every multi-character token also gets a merge rule, as in real
            BPE vocabularies, whose merge tables llama.cpp keeps in memory).
    """

    layers: int = 2
    embd: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    ctx: int = 2048
    f16: bool = False
    seed: int = 0
    weights: str = ""
    vocab: int = 0
    tokenizer: str = "llama"

    @property
    def weight_type(self) -> str:
        """The matrices' type name."""
        return self.weights or ("f16" if self.f16 else "f32")


def _byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


@dataclass(frozen=True, slots=True)
class _Vocab:
    tokens: list[bytes]
    scores: list[float]
    types: list[int]
    merges: list[str]
    silent: int  # the first ``silent`` tokens are never emitted (control and byte tokens)


def _vocab(size: int = 0, tokenizer: str = "llama") -> _Vocab:
    kinds = gguf.TokenType
    tokens: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []
    bpe = tokenizer == "gpt2"
    space = "Ġ" if bpe else "▁"

    def add(text: str, score: float, kind: int) -> None:
        tokens.append(text.encode("utf-8"))
        scores.append(score)
        types.append(int(kind))

    add("<unk>", 0.0, kinds.UNKNOWN if not bpe else kinds.CONTROL)
    add("<s>", 0.0, kinds.CONTROL)
    add("</s>", 0.0, kinds.CONTROL)
    if bpe:
        for char in _byte_chars():
            add(char, 0.0, kinds.NORMAL)
    else:
        for byte in range(256):
            add(f"<0x{byte:02X}>", 0.0, kinds.BYTE)
    silent = len(tokens)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = [w.replace("▁", space) for w in _WORDS]
    words += [] if bpe else letters + [c.upper() for c in letters]
    words += [space + c for c in letters]
    # llama.cpp aborts on duplicate token strings
    taken = set(_byte_chars()) if bpe else set()
    for index, word in enumerate(dict.fromkeys(w for w in words if w not in taken)):
        add(word, -float(index + 1) if len(word) > 2 else -100.0 - index, kinds.NORMAL)
    for index in range(max(0, size - len(tokens))):
        add(f"{space}x{index}", -1000.0 - index, kinds.NORMAL)
    merges: list[str] = []
    if bpe:
        for token in tokens[silent:]:
            text = token.decode("utf-8")
            if len(text) > 1:
                merges.append(f"{text[:-1]} {text[-1]}")
    return _Vocab(tokens, scores, types, merges, silent)


def _write_metadata(writer: gguf.GGUFWriter, shape: TinyModel, vocab: _Vocab) -> None:
    head_dim = shape.embd // shape.heads
    writer.add_name("hostler-tiny-llama")
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.embd)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_file_type(_FILE_TYPES[shape.weight_type])
    writer.add_tokenizer_model(shape.tokenizer)
    if vocab.merges:
        writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(
        "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )


def write_tiny_llama(path: str | Path, shape: TinyModel | None = None) -> Path:
    """Write a random-weight llama model to ``path`` and return the path."""
    shape = shape or TinyModel()
    kind = _check(shape)
    out = Path(path)
    rng = np.random.default_rng(shape.seed)
    head_dim = shape.embd // shape.heads
    vocab_table = _vocab(shape.vocab, shape.tokenizer)
    writer = gguf.GGUFWriter(str(out), "llama")
    _write_metadata(writer, shape, vocab_table)

    def store(name: str, data: np.ndarray, kind: str) -> None:
        if kind == "f32":
            writer.add_tensor(name, data)
        elif kind == "f16":
            writer.add_tensor(name, data.astype(np.float16))
        elif kind in _RANDOM_BLOCKS:
            blocks = _random_blocks(rng, data.shape, kind)
            writer.add_tensor(name, blocks, raw_dtype=WEIGHT_TYPES[kind])
        else:
            quantized = gguf.quants.quantize(data, WEIGHT_TYPES[kind])
            writer.add_tensor(name, quantized, raw_dtype=WEIGHT_TYPES[kind])

    edge = "q8_0" if kind in _RANDOM_BLOCKS else kind  # token embedding and output head

    def matrix(name: str, rows: int, cols: int, scale: float = 0.02) -> None:
        store(name, (rng.standard_normal((rows, cols)) * scale).astype(np.float32), kind)

    def ones(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, dtype=np.float32))

    vocab = len(vocab_table.tokens)
    store("token_embd.weight", rng.standard_normal((vocab, shape.embd)).astype(np.float32), edge)
    for layer in range(shape.layers):
        ones(f"blk.{layer}.attn_norm.weight", shape.embd)
        matrix(f"blk.{layer}.attn_q.weight", shape.heads * head_dim, shape.embd)
        matrix(f"blk.{layer}.attn_k.weight", shape.kv_heads * head_dim, shape.embd)
        matrix(f"blk.{layer}.attn_v.weight", shape.kv_heads * head_dim, shape.embd)
        matrix(f"blk.{layer}.attn_output.weight", shape.embd, shape.heads * head_dim)
        ones(f"blk.{layer}.ffn_norm.weight", shape.embd)
        matrix(f"blk.{layer}.ffn_gate.weight", shape.ff, shape.embd)
        matrix(f"blk.{layer}.ffn_up.weight", shape.ff, shape.embd)
        matrix(f"blk.{layer}.ffn_down.weight", shape.embd, shape.ff)
    ones("output_norm.weight", shape.embd)
    # Output head: zero rows for control and byte tokens, so only printable pieces come out
    # (a random byte token makes invalid UTF-8, which llama-server refuses with HTTP 500).
    head = rng.standard_normal((vocab, shape.embd)).astype(np.float32)
    head[np.array(vocab_table.types) != int(gguf.TokenType.NORMAL)] = 0.0
    head[: vocab_table.silent] = 0.0
    store("output.weight", head, edge)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _check(shape: TinyModel) -> str:
    """The shape's weight type, once the shape is known to be writable."""
    if shape.embd % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError("embd must divide by heads, and heads by kv_heads")
    kind = shape.weight_type
    if kind not in WEIGHT_TYPES:
        raise ValueError(f"weights {kind!r}: one of {', '.join(WEIGHT_TYPES)}")
    block = gguf.GGML_QUANT_SIZES[WEIGHT_TYPES[kind]][0]
    if shape.embd % block or shape.ff % block:
        raise ValueError(f"{kind} weights need embd and ff multiples of {block}")
    return kind


def _random_blocks(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """Random quantized blocks whose f16 scales are small and finite (``q4_k``, ``iq4_nl``)."""
    rows, cols = shape
    block, size = gguf.GGML_QUANT_SIZES[WEIGHT_TYPES[kind]]
    blocks = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.001).tobytes(), dtype=np.uint8)
    blocks[:, :, 0:2] = scale  # d (q4_k: then dmin, also small)
    if kind == "q4_k":
        blocks[:, :, 2:4] = scale
    return blocks.reshape(rows, (cols // block) * size)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description="Write a tiny random-weight llama GGUF.")
    parser.add_argument("out")
    defaults = TinyModel()
    for name in ("layers", "embd", "heads", "kv_heads", "ff", "ctx", "seed"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name)
        )
    parser.add_argument("--vocab", type=int, default=0, help="pad the vocabulary to N tokens")
    parser.add_argument("--tokenizer", choices=["llama", "gpt2"], default="llama")
    parser.add_argument("--f16", action="store_true", help="store matrices as F16")
    parser.add_argument("--weights", choices=sorted(WEIGHT_TYPES), default="", help="matrix type")
    args = parser.parse_args(argv)
    shape = TinyModel(
        args.layers,
        args.embd,
        args.heads,
        args.kv_heads,
        args.ff,
        args.ctx,
        args.f16,
        args.seed,
        weights=args.weights,
        vocab=args.vocab,
        tokenizer=args.tokenizer,
    )
    path = write_tiny_llama(args.out, shape)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
