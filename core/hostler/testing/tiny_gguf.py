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

__all__ = ["TinyModel", "write_tiny_llama"]

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
    """The shape of a generated model."""

    layers: int = 2
    embd: int = 64
    heads: int = 4
    kv_heads: int = 2
    ff: int = 128
    ctx: int = 2048
    f16: bool = False
    seed: int = 0


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    kinds = gguf.TokenType
    tokens: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, score: float, kind: int) -> None:
        tokens.append(text.encode("utf-8"))
        scores.append(score)
        types.append(int(kind))

    add("<unk>", 0.0, kinds.UNKNOWN)
    add("<s>", 0.0, kinds.CONTROL)
    add("</s>", 0.0, kinds.CONTROL)
    for byte in range(256):
        add(f"<0x{byte:02X}>", 0.0, kinds.BYTE)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = _WORDS + letters + [c.upper() for c in letters] + ["▁" + c for c in letters]
    # llama.cpp aborts on duplicate token strings
    for index, word in enumerate(dict.fromkeys(words)):
        add(word, -float(index + 1) if len(word) > 2 else -100.0 - index, kinds.NORMAL)
    return tokens, scores, types


def _write_metadata(
    writer: gguf.GGUFWriter,
    shape: TinyModel,
    tokens: list[bytes],
    scores: list[float],
    types: list[int],
) -> None:
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
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.f16 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
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
    if shape.embd % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError("embd must divide by heads, and heads by kv_heads")
    out = Path(path)
    rng = np.random.default_rng(shape.seed)
    head_dim = shape.embd // shape.heads
    tokens, scores, types = _vocab()
    writer = gguf.GGUFWriter(str(out), "llama")
    _write_metadata(writer, shape, tokens, scores, types)

    def matrix(name: str, rows: int, cols: int, scale: float = 0.02) -> None:
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        writer.add_tensor(name, data.astype(np.float16) if shape.f16 else data)

    def ones(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, dtype=np.float32))

    vocab = len(tokens)
    matrix("token_embd.weight", vocab, shape.embd, scale=1.0)
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
    head[np.array(types) != int(gguf.TokenType.NORMAL)] = 0.0
    writer.add_tensor("output.weight", head.astype(np.float16) if shape.f16 else head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description="Write a tiny random-weight llama GGUF.")
    parser.add_argument("out")
    defaults = TinyModel()
    for name in ("layers", "embd", "heads", "kv_heads", "ff", "ctx", "seed"):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name)
        )
    parser.add_argument("--f16", action="store_true", help="store matrices as F16")
    args = parser.parse_args(argv)
    shape = TinyModel(
        args.layers, args.embd, args.heads, args.kv_heads, args.ff, args.ctx, args.f16, args.seed
    )
    path = write_tiny_llama(args.out, shape)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
