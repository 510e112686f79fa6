"""Write tiny random-weight llama models in MLX's directory layout, that ``mlx_lm.server`` loads.

An MLX model is a directory: ``config.json`` (the shape), ``model.safetensors`` (the weights)
and a tokenizer (``tokenizer.json`` + ``tokenizer_config.json``, which transformers'
``AutoTokenizer`` reads offline). This writes all four with numpy and the standard library
alone (no mlx, no network): a word-level tokenizer over a few dozen words and a chat template,
so ``/v1/chat/completions`` answers (nonsense, deterministically at temperature 0).

Command line: ``python -m hostler.testing.tiny_mlx OUT_DIR [--layers N --hidden N ...]``.
"""

from __future__ import annotations

import argparse
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CHAT_TEMPLATE", "WORDS", "TinyMlxModel", "write_tiny_mlx"]

#: The tokenizer's words after its four special tokens (unknown words read as ``<unk>``).
WORDS: tuple[str, ...] = tuple(
    [
        "user",
        "assistant",
        "system",
        "hello",
        "world",
        "the",
        "a",
        "an",
        "is",
        "are",
        "was",
        "be",
        "to",
        "of",
        "and",
        "in",
        "on",
        "at",
        "it",
        "you",
        "i",
        "we",
        "they",
        "what",
        "who",
        "how",
        "why",
        "yes",
        "no",
        "good",
        "bad",
        "cat",
        "dog",
        "red",
        "blue",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
    ]
)
#: A plain chat template: one ``role: content`` line per message, then ``assistant:``.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")


@dataclass(frozen=True, slots=True)
class TinyMlxModel:
    """The shape of a generated model (the defaults load and answer in about a second)."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    context: int = 2048
    seed: int = 0


def _tokenizer_json() -> dict[str, object]:
    vocab = {token: index for index, token in enumerate((*_SPECIALS, *WORDS))}
    added = [
        {
            "id": index,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for index, token in enumerate(_SPECIALS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format: an 8-byte header length, a JSON header, then the raw data."""
    header: dict[str, object] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, array in tensors.items():
        size = array.nbytes
        header[name] = {
            "dtype": "F16",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for array in tensors.values():
            out.write(np.ascontiguousarray(array).tobytes())


def _config(shape: TinyMlxModel, vocab: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": shape.context,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }


def write_tiny_mlx(directory: str | Path, shape: TinyMlxModel | None = None) -> Path:
    """Write a tiny llama model into ``directory`` (created) and return it, absolute.

    Raises:
        ValueError: The shape is not one llama accepts (heads must divide the width, KV heads
            the heads; every size at least 1).
    """
    shape = shape or TinyMlxModel()
    sizes = (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.intermediate)
    if min(sizes) < 1 or shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError(f"not a llama shape: {shape}")
    out = Path(directory).absolute()
    out.mkdir(parents=True, exist_ok=True)
    vocab = len(_SPECIALS) + len(WORDS)
    head_dim = shape.hidden // shape.heads
    rng = np.random.default_rng(shape.seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16)

    ones = np.ones(shape.hidden, dtype=np.float16)
    tensors = {"model.embed_tokens.weight": matrix(vocab, shape.hidden)}
    for layer in range(shape.layers):
        at = f"model.layers.{layer}"
        tensors |= {
            f"{at}.input_layernorm.weight": ones,
            f"{at}.post_attention_layernorm.weight": ones,
            f"{at}.self_attn.q_proj.weight": matrix(shape.heads * head_dim, shape.hidden),
            f"{at}.self_attn.k_proj.weight": matrix(shape.kv_heads * head_dim, shape.hidden),
            f"{at}.self_attn.v_proj.weight": matrix(shape.kv_heads * head_dim, shape.hidden),
            f"{at}.self_attn.o_proj.weight": matrix(shape.hidden, shape.heads * head_dim),
            f"{at}.mlp.gate_proj.weight": matrix(shape.intermediate, shape.hidden),
            f"{at}.mlp.up_proj.weight": matrix(shape.intermediate, shape.hidden),
            f"{at}.mlp.down_proj.weight": matrix(shape.hidden, shape.intermediate),
        }
    tensors["model.norm.weight"] = ones
    _write_safetensors(out / "model.safetensors", tensors)
    (out / "config.json").write_text(json.dumps(_config(shape, vocab), indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(_tokenizer_json()) + "\n")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": shape.context,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    """Write a tiny MLX model directory from the command line."""
    parser = argparse.ArgumentParser(prog="python -m hostler.testing.tiny_mlx")
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=128)
    args = parser.parse_args(argv)
    shape = TinyMlxModel(args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate)
    try:
        print(write_tiny_mlx(args.out, shape))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
