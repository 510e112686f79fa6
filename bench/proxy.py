"""What the HTTP face costs: requests through ``hostler serve`` vs straight to ``llama-server``.

Run: ``python3 dev.py run python bench/proxy.py [--rounds N] [--model FILE.gguf] [--quick]``.

One real ``llama-server`` (a tiny generated llama by default, or ``--model``), kept resident by a
:class:`hostler.Runtime`; the HTTP face (``hostler.serve``) runs in the same process on loopback,
as ``hostler serve`` does. Each round runs both candidates side by side, in alternating order:

- **direct**: the same request to the engine's own port (the floor: no proxy at all);
- **hostler**: through the face — routing by ``model``, the queue, the GPU slot, the pool's
  hand-out, the physical gate, and the byte relay.

Measured: warm request latency (``max_tokens`` 1, not streamed), streaming time to the first
chunk, and 16 concurrent streaming clients (aggregate chunks per second). Medians of rounds;
ratios are medians of per-round ratios. llama.cpp's router mode is not measured here yet.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx

import hostler
from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.plugin import LaunchSpec
from hostler.serve.app import make_app
from hostler.serve.server import HttpServer
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter

KEY = "llamacpp:bench:0"
SLOTS = 16


def body(*, stream: bool, tokens: int) -> dict[str, object]:
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
        "ignore_eos": True,
    }


async def latency(client: httpx.AsyncClient, url: str) -> float:
    start = time.perf_counter()
    response = await client.post(url, json=body(stream=False, tokens=1))
    response.raise_for_status()
    return time.perf_counter() - start


async def first_chunk(client: httpx.AsyncClient, url: str) -> float:
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, json=body(stream=True, tokens=8)) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no chunk")
    return first


async def concurrent(client: httpx.AsyncClient, url: str, clients: int = 16) -> float:
    chunks = 0

    async def one() -> None:
        nonlocal chunks
        async with client.stream("POST", url, json=body(stream=True, tokens=48)) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and line != "data: [DONE]":
                    chunks += 1

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(one)
    return chunks / (time.perf_counter() - start)


async def main(args: argparse.Namespace) -> None:
    rounds = 4 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = Path(args.model) if args.model else write_tiny_llama(folder / "bench.gguf")
        with EventStore.open(folder / "events.db") as store:
            ledger = HostLedger(
                store,
                OwnerIdentity.current("bench"),
                lambda: compute_budget(HostMemory(64 * 2**30)),
            )
            adapter = LlamaCppAdapter()

            def build(key: str) -> Supervisor:
                return Supervisor(
                    key,
                    adapter,
                    lambda port: LaunchSpec(
                        key, model, port, ctx_per_slot=512, slots=SLOTS, work_dir=folder / "work"
                    ),
                    store,
                    run_dir=folder / "run",
                    token_prefix="bench-proxy",
                    policy=SupervisorPolicy(idle_timeout=0),
                    ledger=ledger,
                )

            runtime = hostler.Runtime(store, build, ledger=ledger)
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with (
                runtime,
                anyio.create_task_group() as tg,
                httpx.AsyncClient(timeout=120, limits=limits) as client,
            ):
                server = HttpServer(make_app(runtime, {"bench": "llamacpp:bench"}), "127.0.0.1", 0)
                tg.start_soon(server.serve)
                await server.started.wait()
                via = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                loaded = await client.post(via, json=body(stream=False, tokens=1))  # loads it
                loaded.raise_for_status()
                direct = f"http://127.0.0.1:{runtime.pool.supervisor(KEY).port}/v1/chat/completions"
                for url in (direct, via):  # warm both paths' connections
                    for _ in range(3):
                        await latency(client, url)
                results: dict[str, dict[str, list[float]]] = {}
                measures: dict[str, Callable[[httpx.AsyncClient, str], Awaitable[float]]] = {
                    "latency": latency,
                    "first chunk": first_chunk,
                    "16 streams": concurrent,
                }
                for name, measure in measures.items():
                    samples: dict[str, list[float]] = {"direct": [], "hostler": []}
                    count = rounds if name != "16 streams" else max(3, rounds // 10)
                    for round_no in range(count):
                        order = [("direct", direct), ("hostler", via)]
                        for who, url in order if round_no % 2 == 0 else order[::-1]:
                            samples[who].append(await measure(client, url))
                    results[name] = samples
                server.stop()
                tg.cancel_scope.cancel()
    print(
        f"{'metric':<14} {'direct':>12} {'hostler':>12} {'ratio':>8} {'added':>10}  [ratio range]"
    )
    for name, samples in results.items():
        ratios = [h / d for h, d in zip(samples["hostler"], samples["direct"], strict=True)]
        d, h = statistics.median(samples["direct"]), statistics.median(samples["hostler"])
        unit = "chunks/s" if name == "16 streams" else "ms"
        scale = 1.0 if unit == "chunks/s" else 1000.0
        added = "" if unit == "chunks/s" else f"{(h - d) * scale:+.2f} ms"
        print(
            f"{name:<14} {d * scale:>9.2f} {unit[:2]:<2} {h * scale:>9.2f} {unit[:2]:<2} "
            f"{statistics.median(ratios):>7.3f}x {added:>10}  "
            f"[{min(ratios):.3f}-{max(ratios):.3f}] n={len(ratios)}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--model", help="a GGUF file (default: a tiny generated llama)")
    parser.add_argument("--quick", action="store_true")
    anyio.run(main, parser.parse_args())
