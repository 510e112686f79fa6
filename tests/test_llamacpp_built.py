"""The ``llama-server`` that ``hostler engine build llamacpp`` makes (opt-in: ``tox -e
llamacpp-build``).

Collected only when ``$HOSTLER_BUILT_LLAMA_SERVER`` names it (tests/conftest.py); the tox env
builds it first (minutes: every CPU variant of ggml's CPU backend). It is what hostler finds,
its CPU variants lie beside it, and it runs the quantized weights and KV cache that the PyPI
wheel's dies on with SIGILL on a CPU without AVX-VNNI or AMX, through the real daemon.
"""

from __future__ import annotations

import os
from pathlib import Path

import openai

from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.binary import find_llama_server
from hostler_llamacpp.build import installed_build

from _daemons import ServeChild, events

BUILT = Path(os.environ.get("HOSTLER_BUILT_LLAMA_SERVER", "/nonexistent"))


def test_it_is_the_engine_hostler_finds_with_its_cpu_variants_beside_it() -> None:
    assert installed_build() == BUILT
    assert find_llama_server() == BUILT or os.environ.get("HOSTLER_LLAMA_SERVER")
    variants = sorted(p.name for p in BUILT.parent.glob("libggml-cpu-*.so"))
    assert len(variants) >= 3, variants  # chosen when it starts, not when it was built


def test_it_serves_quantized_weights_with_a_quantized_kv_cache(tmp_path: Path) -> None:
    model = write_tiny_llama(
        tmp_path / "q8.gguf", TinyModel(embd=128, heads=4, ff=256, weights="q8_0")
    )
    served = ServeChild(
        tmp_path,
        f'[[models]]\nid = "q8"\npath = "{model}"\nctx = 512\nkv_type = "q8_0"\n',
        f'[engine_defaults.llamacpp]\nbinary = "{BUILT}"\n',
    )
    try:
        client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(
            model="q8", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert answer.choices[0].finish_reason in {"length", "stop"}
        kinds = [kind for _, kind, _ in events(served.data)]
        assert "cpu.unsupported" not in kinds and "engine.crashed" not in kinds
    finally:
        served.close()
