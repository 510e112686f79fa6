"""What the HTTP face costs, and how it swaps, against ``llama-server`` direct and its router mode.

Run: ``python3 dev.py run python bench/proxy.py [--rounds N] [--smollm2] [--quick]``.

One real ``llama-server`` binary for everything. The model is a tiny generated llama by default
(its tokens cost almost nothing: the worst case for a proxy's share) or SmolLM2-135M (F16) with
``--smollm2``. Candidates, run side by side in one process, their order rotated every round:

- **direct**: the request to the engine's own port (the floor: no proxy);
- **hostler**: through ``hostler.serve`` on loopback, as ``hostler serve`` runs it — routing by
  ``model``, the queue, the GPU slot, the pool's hand-out, the physical gate and the relay —
  with its pooled HTTP/1.1 client (:class:`hostler.serve.upstream.PooledUpstream`);
- **hostler-httpx**: the same app with the httpx client instead (how the client was chosen);
- **router**: llama.cpp's own router mode (``llama-server --models-dir DIR --models-max 1``),
  the same engine flags for its child (16 slots of 512 tokens).

Measured: warm request latency (``max_tokens`` 1, not streamed), streaming time to the first
chunk, 16 concurrent streaming clients (aggregate chunks per second), and swap time: two models
A and B, room for one (hostler: a budget of 1.5 models; router: ``--models-max 1``), requests
alternating A, B, A, ... — each one unloads the other model and loads its own. Then the order
test: a long stream on A, a request for B, then three more for A — which is served when.
Medians of rounds; ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
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
from hostler.engines.price import price_from_ledger
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.plugin import LaunchSpec
from hostler.serve.app import make_app
from hostler.serve.server import HttpServer
from hostler.serve.upstream import HttpxUpstream, PooledUpstream
from hostler.testing.smollm2 import smollm2_gguf
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter
from hostler_llamacpp.binary import find_llama_server

SLOTS = 16
CTX = 512
GIB = 2**30
Measure = Callable[[httpx.AsyncClient, str, str], Awaitable[float]]


def body(model: str, *, stream: bool, tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
        "ignore_eos": True,
    }


async def latency(client: httpx.AsyncClient, url: str, model: str) -> float:
    start = time.perf_counter()
    response = await client.post(url, json=body(model, stream=False, tokens=1))
    response.raise_for_status()
    return time.perf_counter() - start


async def first_chunk(client: httpx.AsyncClient, url: str, model: str) -> float:
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, json=body(model, stream=True, tokens=8)) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no chunk")
    return first


async def concurrent(client: httpx.AsyncClient, url: str, model: str) -> float:
    chunks = 0

    async def one() -> None:
        nonlocal chunks
        payload = body(model, stream=True, tokens=48)
        async with client.stream("POST", url, json=payload) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and line != "data: [DONE]":
                    chunks += 1

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(SLOTS):
            tg.start_soon(one)
    return chunks / (time.perf_counter() - start)


async def patiently(
    who: str, measure: Measure, client: httpx.AsyncClient, url: str, model: str
) -> float:
    """A warm-up request, tried up to five times (a router still loading its child may hang up)."""
    for attempt in range(5):
        try:
            return await measure(client, url, model)
        except httpx.HTTPError as exc:
            print(f"  warm-up: {who} failed ({type(exc).__name__}); again")
            await anyio.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"{who} does not answer")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Router:
    """llama.cpp's router mode over a models folder, one model loaded at a time."""

    def __init__(self, folder: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [
                str(find_llama_server()),
                "--models-dir", str(folder),
                "--models-max", "1",
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--ctx-size", str(CTX * SLOTS),
                "--parallel", str(SLOTS),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    async def ready(self, client: httpx.AsyncClient) -> None:
        for _ in range(600):
            try:
                if (await client.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await anyio.sleep(0.05)
        raise RuntimeError("the router did not come up")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def runtime_for(
    folder: Path, store: EventStore, models: dict[str, Path], budget_gib: list[float | None]
) -> tuple[hostler.Runtime, Callable[[str], int]]:
    """A runtime of ``models``; ``budget_gib[0]`` is the host budget, read at each decision."""
    ledger = HostLedger(
        store,
        OwnerIdentity.current("bench"),
        lambda: compute_budget(HostMemory(64 * GIB), override_gib=budget_gib[0]),
    )
    adapter = LlamaCppAdapter()

    def spec(key: str, port: int) -> LaunchSpec:
        name = key.split(":")[1]
        work = folder / "work" / name
        return LaunchSpec(key, models[name], port, ctx_per_slot=CTX, slots=SLOTS, work_dir=work)

    def build(key: str) -> Supervisor:
        return Supervisor(
            key,
            adapter,
            lambda port: spec(key, port),
            store,
            run_dir=folder / "run",
            token_prefix=f"bench-proxy-{folder.name}",
            policy=SupervisorPolicy(idle_timeout=0),
            ledger=ledger,
            footprint=lambda: alone[key],  # reserved in the ledger, as hostler serve does
        )

    def price(key: str) -> int:
        name = key.split(":")[1]
        launch = price_from_ledger(
            adapter, ledger, key=key, model=models[name], ctx=CTX, slots=SLOTS, kv_type=None
        )
        return int(launch.reserved_bytes)

    # each model's price alone (16 slots), fixed: a plan that sheds slots to squeeze in beside
    # another model (C6) would make this a co-residency test, not a swap
    alone = {f"llamacpp:{name}:0": price(f"llamacpp:{name}:0") for name in models}
    runtime = hostler.Runtime(store, build, ledger=ledger, estimate=alone.__getitem__)
    return runtime, alone.__getitem__


def rotated(names: list[str], round_no: int) -> list[str]:
    """Every candidate takes every place in turn (and the direction flips every other lap)."""
    k = round_no % len(names)
    order = names[k:] + names[:k]
    return order if (round_no // len(names)) % 2 == 0 else order[::-1]


def report(title: str, results: dict[str, list[float]], *, unit: str, base: str) -> None:
    scale = 1.0 if unit == "chunks/s" else 1000.0
    print(f"\n{title} (median of {len(results[base])} rounds; ratio to {base}: median [min-max])")
    for who, samples in results.items():
        ratios = [s / b for s, b in zip(samples, results[base], strict=True)]
        added = statistics.median(
            [(s - b) * scale for s, b in zip(samples, results[base], strict=True)]
        )
        extra = "" if unit == "chunks/s" else f"  added {added:+.2f} ms"
        print(
            f"  {who:<14} {statistics.median(samples) * scale:>9.2f} {unit:<8} "
            f"{statistics.median(ratios):6.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]{extra}"
        )


async def steady(args: argparse.Namespace, folder: Path, model: Path) -> None:
    rounds = 6 if args.quick else args.rounds
    models_dir = folder / "models"
    models_dir.mkdir()
    shutil.copy(model, models_dir / "bench.gguf")
    router = Router(models_dir, folder / "router.log")
    with EventStore.open(folder / "events.db") as store:
        runtime, _price = runtime_for(folder, store, {"bench": model}, [None])
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with (
            runtime,
            anyio.create_task_group() as tg,
            httpx.AsyncClient(timeout=300, limits=limits) as client,
        ):
            urls: dict[str, str] = {}
            for name, upstream in (
                ("hostler", PooledUpstream()),
                ("hostler-httpx", HttpxUpstream()),
            ):
                app = make_app(runtime, {"bench": "llamacpp:bench"}, upstream=upstream)
                server = HttpServer(app, "127.0.0.1", 0)
                tg.start_soon(server.serve)
                await server.started.wait()
                urls[name] = f"http://127.0.0.1:{server.port}/v1/chat/completions"
            await latency(client, urls["hostler"], "bench")  # loads it
            port = runtime.pool.supervisor("llamacpp:bench:0").port
            urls = {"direct": f"http://127.0.0.1:{port}/v1/chat/completions", **urls}
            await router.ready(client)
            urls["router"] = router.url
            for who, url in urls.items():  # warm every path's connections (the router's child)
                for _ in range(3):
                    await patiently(who, latency, client, url, "bench")
            measures: dict[str, tuple[Measure, int, str]] = {
                "warm request latency": (latency, rounds, "ms"),
                "time to first chunk": (first_chunk, rounds, "ms"),
                "16 concurrent streams": (concurrent, max(4, rounds // 5), "chunks/s"),
            }
            names = list(urls)
            for title, (measure, count, unit) in measures.items():
                samples: dict[str, list[float]] = {n: [] for n in names}
                failed = dict.fromkeys(names, 0)
                for round_no in range(count):
                    taken: dict[str, float] = {}
                    for who in rotated(names, round_no):
                        try:
                            taken[who] = await measure(client, urls[who], "bench")
                        except httpx.HTTPError:
                            failed[who] += 1  # the round is dropped for every candidate
                    if len(taken) == len(names):
                        for who, value in taken.items():
                            samples[who].append(value)
                if any(failed.values()):
                    print(f"\n{title}: failed requests (their rounds dropped): {failed}")
                report(title, samples, unit=unit, base="direct")
            tg.cancel_scope.cancel()
    router.stop()


async def swaps(args: argparse.Namespace, folder: Path, model: Path) -> None:
    rounds = 4 if args.quick else max(6, args.rounds // 3)
    models_dir = folder / "swap-models"
    models_dir.mkdir()
    for name in ("a", "b"):
        shutil.copy(model, models_dir / f"{name}.gguf")
    router = Router(models_dir, folder / "router-swap.log")
    models = {name: models_dir / f"{name}.gguf" for name in ("a", "b")}
    with EventStore.open(folder / "swap-events.db") as store:
        budget: list[float | None] = [None]
        runtime, price = runtime_for(folder, store, models, budget)
        async with (
            runtime,
            anyio.create_task_group() as tg,
            httpx.AsyncClient(timeout=300) as client,
        ):
            app = make_app(runtime, {"a": "llamacpp:a", "b": "llamacpp:b"})
            server = HttpServer(app, "127.0.0.1", 0)
            tg.start_soon(server.serve)
            await server.started.wait()
            urls = {
                "hostler": f"http://127.0.0.1:{server.port}/v1/chat/completions",
                "router": router.url,
            }
            await router.ready(client)
            for url in urls.values():
                await latency(client, url, "a")
            # room for one: a's price fits, a (as measured) beside b's price does not
            measured = (await runtime.memory.budget())["committed"]
            budget[0] = (price("llamacpp:b:0") + measured / 2) / GIB
            samples: dict[str, list[float]] = {n: [] for n in urls}
            failures = dict.fromkeys(urls, 0)
            for round_no in range(rounds):
                for who in rotated(list(urls), round_no):
                    # two swaps a round: b (a goes), then a (b goes)
                    try:
                        took = [await latency(client, urls[who], m) for m in ("b", "a")]
                    except httpx.HTTPError as exc:
                        failures[who] += 1
                        print(f"  {who}: a swap request failed ({type(exc).__name__}: {exc})")
                        continue
                    samples[who].append(statistics.mean(took))
            resident = [v.key for v in runtime.status().engines if v.state == "running"]
            assert resident == ["llamacpp:a:0"], f"hostler kept {resident}: no swap happened"
            print(f"\nswap rounds that failed: {failures}")
            kept = min(len(s) for s in samples.values())
            samples = {who: s[:kept] for who, s in samples.items()}
            if kept:
                report(
                    "swap: request for the model not loaded (unload + load + answer)",
                    samples,
                    unit="ms",
                    base="router",
                )
            for who, url in urls.items():
                print(f"  order under a swap, {who}: {await order(client, url)}")
            tg.cancel_scope.cancel()
    router.stop()


async def order(client: httpx.AsyncClient, url: str) -> str:
    """A long stream on A, then B, then three more A: the order they finish in."""
    await latency(client, url, "a")  # a is loaded
    done: list[str] = []
    cut = False

    async def long_a() -> None:
        nonlocal cut
        chunks = 0
        async with client.stream("POST", url, json=body("a", stream=True, tokens=400)) as response:
            async for line in response.aiter_lines():
                chunks += line.startswith("data: {")
        cut = chunks < 400
        done.append("A-stream")

    async def one(model: str, label: str, delay: float) -> None:
        await anyio.sleep(delay)
        await latency(client, url, model)
        done.append(label)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_a)
        tg.start_soon(one, "b", "B", 0.05)
        for n in range(3):
            tg.start_soon(one, "a", f"A{n + 1}", 0.1 + 0.02 * n)
    return " → ".join(done) + ("  (the A stream was CUT)" if cut else "")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.smollm2:
            model = smollm2_gguf(folder / "cache")
        else:
            model = write_tiny_llama(folder / "bench.gguf")
        print(
            f"model: {model.name} ({model.stat().st_size / 2**20:.1f} MiB), llama-server {find_llama_server()}"
        )
        await steady(args, folder, model)
        await swaps(args, folder, model)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--smollm2", action="store_true", help="SmolLM2-135M instead of a tiny model"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", help="work in this (empty) folder and keep it: engine logs")
    anyio.run(main, parser.parse_args())
