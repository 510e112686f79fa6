"""The runtime with a real ``mlx_lm.server`` on a tiny MLX model, alone and beside llama.cpp.

Started through the real supervisor by ``hostler.Runtime``, ready only once the model answers
(the 1-token probe: its ``/health`` says ok while loading), priced from ``config.json``,
answering a chat completion, and stopped. Then a llama.cpp engine (a tiny GGUF) and an MLX
engine run side by side under one budget, both reserved in the one host ledger.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import hostler
from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.price import LaunchRequest, price_from_ledger
from hostler.engines.process import token_holders
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.events.ledger import LEDGER_STREAM
from hostler.plugin import EngineAdapter, LaunchSpec
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler.testing.tiny_mlx import write_tiny_mlx
from hostler_llamacpp import LlamaCppAdapter
from hostler_mlx import MlxAdapter
from hostler_mlx.pricing import estimate_mlx, weights_resident

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GIB = 2**30
MLX_KEY = "mlx:tiny:0"
LLAMA_KEY = "llamacpp:tiny:0"


class Rig:
    """One log, one ledger, two engine kinds: a tiny MLX directory and a tiny GGUF."""

    def __init__(self, tmp_path: Path, store: EventStore) -> None:
        self.tmp_path = tmp_path
        self.store = store
        self.models = {
            MLX_KEY: write_tiny_mlx(tmp_path / "models" / "tiny-mlx"),
            LLAMA_KEY: write_tiny_llama(tmp_path / "models" / "tiny.gguf"),
        }
        self.adapters: dict[str, EngineAdapter] = {
            MLX_KEY: MlxAdapter(),
            LLAMA_KEY: LlamaCppAdapter(),
        }
        self.ledger = HostLedger(
            store,
            OwnerIdentity.current("mlxtest"),
            lambda: compute_budget(HostMemory(64 * GIB), override_gib=8),
        )
        self.token = f"mlxtest-{os.getpid()}-{tmp_path.name}"

    def price(self, key: str) -> int:
        priced = price_from_ledger(
            self.adapters[key],
            self.ledger,
            LaunchRequest(key=key, model=self.models[key], ctx=512, slots=1, kv_type=None),
        ).price
        return int(priced.reserved_bytes)

    def build(self, key: str) -> Supervisor:
        run = self.tmp_path / "run" / key.split(":", maxsplit=1)[0]
        return Supervisor(
            key,
            self.adapters[key],
            lambda port: LaunchSpec(
                key, self.models[key], port, ctx_per_slot=512, slots=1, work_dir=run / "work"
            ),
            self.store,
            run_dir=run,
            token_prefix=self.token,
            policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=0, startup_timeout=120),
            ledger=self.ledger,
            footprint=lambda: self.price(key),
        )

    def runtime(self) -> hostler.Runtime:
        return hostler.Runtime(
            self.store,
            self.build,
            ledger=self.ledger,
            drain_poll=0.05,
        )

    def pids(self) -> list[int]:
        return [p.pid for p, _ in token_holders(lambda t: t.startswith(self.token))]

    def ledger_rows(self, kind: str) -> list[dict[str, Any]]:
        return [dict(r.payload) for r in self.store.read_stream(LEDGER_STREAM) if r.type == kind]

    def held(self) -> dict[str, int]:
        return {str(row["key"]): int(row["bytes"]) for row in self.ledger.snapshot()["by_key"]}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with EventStore.open(tmp_path / "events.db") as store:
        made = Rig(tmp_path, store)
        try:
            yield made
        finally:
            for pid in made.pids():
                os.killpg(pid, 9)


def chat(port: int) -> dict[str, object]:
    body = json.dumps(
        {
            # hostler's model id, as a client names it (mlx_lm.server alone would look it up
            # as a hub repository, offline: an error)
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 3,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


async def test_mlx_alone_started_priced_answered_stopped(rig: Rig) -> None:
    geometry = MlxAdapter().read_geometry(rig.models[MLX_KEY])
    assert geometry.block_count == 2 and geometry.head_count_kv == 2
    expected = estimate_mlx(geometry, ctx_per_slot=512, slots=1)
    # 2 layers x 2 KV heads x (16 + 16) x 2 bytes x 512 tokens of f16 KV beside the weights
    assert expected == weights_resident(geometry.file_size) + 2 * 2 * 32 * 2 * 512
    assert rig.price(MLX_KEY) == expected  # the one pricing path: admitted at that figure
    async with rig.runtime() as rt:
        async with rt.request(MLX_KEY) as port:
            reserved = rig.ledger_rows("ledger.reserved")
            assert [(r["key"], r["bytes"]) for r in reserved] == [(MLX_KEY, expected)]
            [measured] = rig.ledger_rows("ledger.measured")  # then the real figure replaces it
            assert (measured["estimated"], rig.held()) == (expected, {MLX_KEY: measured["bytes"]})
            assert 0 < measured["bytes"] < expected  # a tiny model: the 1 GiB runtime is generous
            answer = await anyio.to_thread.run_sync(chat, port)
            choices = answer["choices"]
            assert isinstance(choices, list) and choices[0]["finish_reason"] in {"length", "stop"}
        [started] = [
            r for r in rig.store.read_stream(f"engine/{MLX_KEY}") if r.type == "engine.ready"
        ]
        assert started is not None
        assert len(rig.pids()) == 1
        assert await rt.unload(MLX_KEY) is True
    assert rig.pids() == []
    assert rig.held() == {}


async def test_llamacpp_and_mlx_side_by_side_under_one_budget(rig: Rig) -> None:
    async with (
        rig.runtime() as rt,
        rt.request(LLAMA_KEY) as llama_port,
        rt.request(MLX_KEY) as mlx_port,
    ):
        held = rig.held()
        assert set(held) == {LLAMA_KEY, MLX_KEY}
        assert sum(held.values()) <= 8 * GIB  # the one budget holds both
        assert len(rig.pids()) == 2
        both = [
            await anyio.to_thread.run_sync(chat, llama_port),
            await anyio.to_thread.run_sync(chat, mlx_port),
        ]
        assert all(answer["choices"] for answer in both)
    assert rig.pids() == []
    assert rig.held() == {}
