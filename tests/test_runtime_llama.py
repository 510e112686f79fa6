"""The runtime with real ``llama-server`` processes and tiny real models: a budget fits two of three.

The budget is set from one engine's real footprint (reserved, then measured), so that two fit
and three never do. Requests alternate across the three models; a long streaming request runs
through swaps. What must hold: only idle engines are evicted, the stream is never cut, no more
than two engines ever run, and the log explains every eviction (victim, shortfall, the
candidates considered with their demand figures).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from _rigs import LlamaRig, room_for
from hostler import EventStore
from hostler.engines.process import token_holders
from hostler.events.pool import POOL_STREAM

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GIB = 2**30
MODELS = ("alpha", "beta", "gamma")


class Rig(LlamaRig):
    """Three tiny models, one log, one ledger whose budget is set once one engine is measured."""

    def __init__(self, tmp_path: Path, store: EventStore) -> None:
        super().__init__(tmp_path, store, MODELS)

    def running(self) -> int:
        return len(list(token_holders(lambda t: t.startswith(self.token))))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with EventStore.open(tmp_path / "events.db") as store:
        yield Rig(tmp_path, store)


def key_of(name: str) -> str:
    return f"llamacpp:{name}:0"


def chat(port: int, n: int = 4) -> str:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": n, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["choices"][0]["finish_reason"])


def stream(port: int, n: int, gaps: list[float]) -> list[str]:
    """A streaming completion read line by line; the pause between chunks is recorded."""
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "tell a long story"}],
            "max_tokens": n,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    lines = []
    last = time.monotonic()
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line:
                lines.append(line)
                time.sleep(0.01)  # a slow reader: the stream spans the swaps
                now = time.monotonic()
                gaps.append(now - last)
                last = now
    return lines


def evictions(store: EventStore) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for record in store.read_all():
        if record.type == "engine.stop_requested" and record.payload.get("reason") == "evicted":
            found.append((record.stream_id.removeprefix("engine/"), record.payload["decision"]))
    return found


async def test_a_budget_for_two_of_three_evicts_idle_engines_and_explains_each(rig: Rig) -> None:
    async with rig.runtime() as rt:
        # one engine alone, to learn what one costs here (reserved, then measured)
        async with rt.request(key_of("alpha")) as port:
            await anyio.to_thread.run_sync(chat, port)
        one = (await rt.memory.budget())["committed"]
        rig.budget_gib = room_for(2, rig.price(key_of("beta")), one) / GIB  # two, never three
        most = 0
        for name in ("beta", "gamma", "alpha", "beta", "gamma", "beta"):
            async with rt.request(key_of(name)) as port:
                assert await anyio.to_thread.run_sync(chat, port) in {"length", "stop"}
            most = max(most, rig.running())
        assert most <= 2
    assert rig.running() == 0
    found = evictions(rig.store)
    assert len(found) >= 3
    planned = [
        r.payload for r in rig.store.read_stream(POOL_STREAM) if r.type == "pool.room_planned"
    ]
    assert len(planned) == len(found)
    for (victim, decision), plan in zip(found, planned, strict=True):
        assert decision["rule"] == "PP4" and decision["for"] == plan["for_key"]
        assert decision["evict"] == [victim] == plan["evict"]
        assert decision["shortfall"] == plan["shortfall"] > 0
        candidates = {c["key"]: c for c in decision["candidates"]}
        assert victim in candidates and plan["for_key"] not in candidates
        for figures in candidates.values():
            assert {"bytes", "recent_hits", "idle_for", "busy"} <= set(figures)
            assert figures["bytes"] > 0
        # the victim was the least wanted: fewest recent hits, then the longest unused
        rank = sorted(
            candidates.values(), key=lambda c: (c["recent_hits"], -c["idle_for"], c["key"])
        )
        assert rank[0]["key"] == victim


async def test_a_long_stream_is_never_cut_by_swaps(rig: Rig) -> None:
    gaps: list[float] = []
    async with rig.runtime() as rt:
        async with rt.request(key_of("alpha")) as port:
            await anyio.to_thread.run_sync(chat, port)
        one = (await rt.memory.budget())["committed"]
        rig.budget_gib = room_for(2, rig.price(key_of("beta")), one) / GIB
        lines: list[str] = []
        streamed, swapped = anyio.Event(), anyio.Event()

        async def long_stream() -> None:
            async with rt.request(key_of("alpha")) as port:
                streamed.set()
                lines.extend(await anyio.to_thread.run_sync(stream, port, 300, gaps))
                # the request is held until the swaps are over, however fast the stream ran:
                # the engine is busy throughout by construction, not by the machine's speed
                await swapped.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_stream)
            await streamed.wait()
            for name in ("beta", "gamma", "beta", "gamma"):  # each swap needs room
                async with rt.request(key_of(name)) as port:
                    await anyio.to_thread.run_sync(chat, port)
                assert rig.running() <= 2
            swapped.set()
        assert lines[-1] == "data: [DONE]"
        finish = json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"]
        assert finish == "length"
    victims = [victim for victim, _ in evictions(rig.store)]
    assert key_of("alpha") not in victims  # the streaming engine was never chosen
    assert set(victims) <= {key_of("beta"), key_of("gamma")} and len(victims) >= 3


async def test_a_launched_llama_server_gets_its_prompt_cache_adapter(rig: Rig) -> None:
    rig.budget_gib = 8.0
    async with rig.runtime() as rt:
        key = key_of("alpha")
        assert await rt.caches.stats(key) is None  # nothing launched, nothing registered
        async with rt.request(key, session="s1") as port:
            await anyio.to_thread.run_sync(chat, port)
        stats = await rt.caches.stats(key)
        assert stats is not None and stats.budget == 4 * GIB  # CC's default until set
        assert rt.caches.extras(key, "s1") == {"cache_prompt": True, "id_slot": 0}
        await rt.cache.record_turn(key, "s1", 10)
        assert (await rt.caches.stats(key)).entries == 1  # type: ignore[union-attr]
        await rt.caches.set_budget(key, 512 * 1024)  # 10 tokens = 1000 KiB: over, evicted
        after = await rt.caches.stats(key)
        assert after is not None and after.budget == 512 * 1024 and after.entries == 0
        await rt.caches.evict_session("s1")
        await rt.caches.clear(key)
    evicted = [
        r.payload for r in rig.store.read_stream(f"cache/{key}") if r.type == "cache.evicted"
    ]
    assert evicted and evicted[0]["ids"] == ["s1"] and evicted[0]["reason"] == "watermark"
