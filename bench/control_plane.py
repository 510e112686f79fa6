"""hostler's control plane measured from outside: the real ``hostler serve`` against llama.cpp.

Run: ``python3 dev.py run python bench/control_plane.py [--rounds N] [--tiny] [--quick]``.

Nothing of hostler runs inside this process except two helpers: ``find_llama_server()`` (the
binary every candidate runs) and the model writers (``smollm2_gguf``, ``write_tiny_llama``);
part 2 alone opens an ``EventStore`` in-process, as it measures that library. Every daemon is
started as a user starts it — ``hostler serve --config FILE --port P`` as a subprocess (its
own session), with a config file, its data directory and its own ledger in a temporary
folder — and is spoken to over HTTP only. Candidates:

- **hostler**: ``hostler serve``; models ``a`` and ``b`` (``[[models]]``, ``kv_type = "f16"``,
  ``idle_timeout = 0``), loaded on demand.
- **router**: llama.cpp's own router mode, the same binary started with no model and
  ``--models-dir DIR --models-max 1``; the models folder holds ``a.gguf`` and ``b.gguf`` (hard
  links to the files hostler serves), and its per-model flags are exactly the engine flags
  hostler passed to its own engine (read from that engine's command line: ``--jinja``,
  ``--ctx-size``, ``--parallel``, the cache types, ``--cache-reuse``, ``--slot-save-path``...),
  less ``--model``/``--host``/``--port``.
- **direct**: a raw ``llama-server`` spawned by this script with hostler's engine argv verbatim
  (another port, another slot-save folder): the floor.

Model A is SmolLM2-135M-Instruct F16 (``hostler.testing.smollm2.smollm2_gguf``; ``--tiny``: a
generated tiny llama, ``hostler.testing.tiny_gguf``); B is a byte-for-byte copy of A's file
under another name. Two daemon configurations, each its own ``hostler serve`` and router:

- *steady* (parts 4, 5): model ``a`` with 16 slots of 1,024 tokens, the automatic budget;
- *swap* (parts 1–3): ``a`` and ``b`` with one slot of 1,024 tokens each, and a budget for one:
  ``HOSTLER_CAPACITY_BUDGET_GB`` (docs/capacity.md) set to 1.4 × the larger of the two prices
  ``hostler preview MODEL --config FILE --json`` gives before the daemon starts, so either model
  fits alone and never beside the other; the router gets ``--models-max 1``. One slot, because
  with more, a launch planned while the other model is still resident sheds its slots to try to
  fit beside it and keeps that plan after the eviction (see docs/benchmarks.md): the two would
  no longer run the same engine settings.

Requests go through the official ``openai`` client (``AsyncOpenAI``, ``max_retries=0``), the same
for every candidate; the readiness polls and operator calls (``/health``, hostler's
``/api/engines``, ``/metrics`` and unload, the router's ``/models`` and ``/models/unload``) use
httpx. Prompt ``hello``, temperature 0, ``ignore_eos``. Measured, in rounds whose candidate
order alternates (forward in even rounds, reversed in odd ones); each figure is the median over
rounds, each ratio the **median of the per-round ratios** with their [min–max]:

1. **daemon CPU per swapped request**: user + system CPU seconds (psutil) of the ``hostler serve``
   process and any descendant that is not an engine (for the router: its parent process only,
   not its child engine), taken before and after a block of requests alternating B, A, B, ...,
   each of which forces a swap (checked afterwards: hostler's ``hostler_engine_stops_total
   {reason="evicted"}`` must grow by one per request and its engine argv stay the same), divided
   by the number of requests. Not streamed, ``max_tokens`` 1. Goal ≤ 0.02 CPU-s. ``/proc``
   counts CPU time in clock ticks (10 ms): a block of N requests resolves ±10 ms / N per
   request, which matters for the router's few milliseconds (a round where it reads 0 gives
   no ratio).
2. **cold request → first token**: hostler with no engine running (unloaded, its process gone)
   and the router with no model loaded, one streamed chat request until its first content
   chunk; direct: spawn ``llama-server``, poll ``/health`` every 10 ms until 200, then the same
   request, timed from the spawn. Ratios to direct.
3. **swap wall time per request** over the same blocks as 1: hostler / router.
4. **streaming, warm** (steady): the response headers (when ``create(stream=True)`` returns) and
   the first content chunk, each round the median of several requests; added ms over direct.
5. **warm non-streamed latency** (``max_tokens`` 1), ratio to direct; and **16 concurrent
   streams** (32 tokens each): content chunks per second, ratio to direct.

Part 2, the log (in-process, ``hostler.EventStore`` against ``sqlite3``, borrowing
``bench/eventlog.py``'s raw baseline): each round one durable ``EventStore.append`` of one event
and one raw sqlite3 ``BEGIN IMMEDIATE``/``INSERT``/``COMMIT`` doing the same work (the same
table and indexes, WAL + ``synchronous=FULL``, so an fsync per commit, the payload JSON-encoded
the same way), order alternating: the median of each and the median of the paired ratios.
Then replay (``hostler.replay``) of a lifecycle log against a raw fetch of the columns replay
reads + ``json.loads`` of each payload, paired the same way.

Each part prints a markdown table; raw samples go to ``bench/out/control_plane.json``. Every
process started is stopped in ``finally`` (SIGTERM, then SIGKILL of its process group and of
any engine it was seen running), on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import httpx
import psutil
from openai import APIConnectionError, AsyncOpenAI

from hostler import EventStore, replay
from hostler.paths import default_data_dir
from hostler.testing.smollm2 import smollm2_gguf
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp.binary import find_llama_server

sys.path.insert(0, str(Path(__file__).parent))
from eventlog import INSERT, build_lifecycle_log, now_stamp, payload, raw_connect, raw_row

OUT = Path(__file__).parent / "out"
GIB = 2**30
CTX = 1024  # per slot, every configuration
STEADY_SLOTS = 16
SWAP_SLOTS = 1
BUDGET_FACTOR = 1.4  # the swap budget: this × the larger price (fits one, never two)
CONCURRENT = 16
CONCURRENT_TOKENS = 32
STREAM_TOKENS = 8
CPU_GOAL = 0.02
START_WAIT = 120.0
T = TypeVar("T")
#: Requests that failed on the connection (no answer), per candidate: retried, and reported.
FAILURES: dict[str, int] = {}
MESSAGES: list[Any] = [{"role": "user", "content": "hello"}]
EXTRA: dict[str, object] = {"ignore_eos": True}


# -- processes --------------------------------------------------------------------------------


class Reaper:
    """Every process this script starts, and every engine it saw: all stopped at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seen: dict[int, float] = {}  # pid -> create_time, to kill only that very process
        self._logs: list[Any] = []

    def spawn(
        self, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        handle = log.open("ab")
        self._logs.append(handle)
        proc = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def note(self, pid: int | None) -> None:
        if pid is None or pid in self.seen:
            return
        with contextlib.suppress(psutil.Error):
            self.seen[pid] = psutil.Process(pid).create_time()

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
        """SIGTERM (hostler then stops its engines), then SIGKILL to the whole group."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                self.note(child.pid)  # engines live in their own sessions: killed below if left
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its session's leftovers (a router's child)
        if proc.poll() is None:
            proc.wait(10)
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)
        for pid, created in self.seen.items():
            try:
                process = psutil.Process(pid)
                if abs(process.create_time() - created) < 0.01:
                    process.kill()
                    print(f"  (killed a leftover engine, pid {pid})", file=sys.stderr)
            except psutil.Error:
                pass
        for handle in self._logs:
            handle.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hostler_command() -> list[str]:
    """The ``hostler`` command of this installation (as a user of this venv runs it)."""
    beside = Path(sys.executable).parent / "hostler"
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def is_engine(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("llama-server")
    except psutil.Error:
        return False


def daemon_cpu(pid: int, *, children: bool) -> float:
    """CPU seconds of ``pid`` (and, with ``children``, of its non-engine descendants)."""
    root = psutil.Process(pid)
    total = cpu_seconds(root)
    if children:
        stack = root.children()
        while stack:
            child = stack.pop()
            if is_engine(child):
                continue  # an engine and whatever it runs are not the control plane
            try:
                total += cpu_seconds(child)
                stack.extend(child.children())
            except psutil.Error:
                pass
    return total


async def wait_health(http: httpx.AsyncClient, base: str, proc: subprocess.Popen[bytes]) -> None:
    """Poll ``/health`` every 10 ms until it answers 200."""
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with status {proc.returncode}")
        try:
            if (await http.get(f"{base}/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.01)
    raise RuntimeError(f"{base} did not become healthy within {START_WAIT:.0f} s")


def strip_flags(argv: list[str], drop: set[str]) -> list[str]:
    """``argv`` without the flags in ``drop`` and their values."""
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
            continue
        if token in drop:
            skip = True
            continue
        out.append(token)
    return out


def replace_value(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    return out


# -- the candidates ----------------------------------------------------------------------------


@dataclass
class Hostler:
    """``hostler serve`` in its own folder, spoken to over HTTP."""

    proc: subprocess.Popen[bytes]
    base: str
    folder: Path
    token: str = ""

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    async def engines(self, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        answer = await http.get(f"{self.base}/api/engines")
        answer.raise_for_status()
        return list(answer.json()["engines"])

    async def running(self, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        return [e for e in await self.engines(http) if e["state"] != "stopped"]

    async def evictions(self, http: httpx.AsyncClient) -> int:
        text = (await http.get(f"{self.base}/metrics")).text
        found = re.search(r'^hostler_engine_stops_total\{reason="evicted"\} (\S+)$', text, re.M)
        return int(float(found.group(1))) if found else 0

    async def unload_all(self, http: httpx.AsyncClient) -> None:
        """Unload every engine and wait until none runs and its process is gone."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = await self.running(http)
            if not live:
                return
            for engine in live:
                if engine["state"] == "running":
                    url = f"{self.base}/api/engines/{engine['key']}/unload"
                    (await http.post(url, headers=self.auth)).raise_for_status()
            await asyncio.sleep(0.02)
        raise RuntimeError("hostler did not unload its engines within 60 s")


@dataclass
class Router:
    proc: subprocess.Popen[bytes]
    base: str

    async def loaded(self, http: httpx.AsyncClient) -> dict[str, str]:
        answer = await http.get(f"{self.base}/models")
        answer.raise_for_status()
        return {m["id"]: m["status"]["value"] for m in answer.json()["data"]}

    async def unload_all(self, http: httpx.AsyncClient) -> None:
        """Unload every model and wait until none is loaded and no child process is left."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = await self.loaded(http)
            children = psutil.Process(self.proc.pid).children()
            if all(s == "unloaded" for s in states.values()) and not children:
                return
            for model, state in states.items():
                if state == "loaded":
                    await http.post(f"{self.base}/models/unload", json={"model": model})
            await asyncio.sleep(0.02)
        raise RuntimeError("the router did not unload its models within 60 s")


@dataclass
class Setup:
    """One configuration: its hostler, its router, and the engine argv hostler launched."""

    hostler: Hostler
    router: Router
    engine_argv: list[str]  # without the binary
    models: dict[str, Path]


def write_config(folder: Path, models: dict[str, Path], slots: int, ctx: int = CTX) -> Path:
    """hostler's config for ``models``: each with ``slots`` slots of ``ctx`` tokens, KV f16."""
    lines = [
        "# written by a benchmark of bench/",
        "[daemon]",
        f"data_dir = {json.dumps(str(folder / 'data'))}",
        f"ledger = {json.dumps(str(folder / 'ledger.db'))}",
        "idle_timeout = 0",
        "",
    ]
    for name, path in models.items():
        lines += [
            "[[models]]",
            f'id = "{name}"',
            f"path = {json.dumps(str(path))}",
            f"ctx = {ctx}",
            f"slots = {slots}",
            'kv_type = "f16"',
            "",
        ]
    config = folder / "hostler.toml"
    config.write_text("\n".join(lines), encoding="utf-8")
    return config


def preview_price(config: Path, model: str) -> int:
    """What ``hostler preview`` says the daemon would reserve for ``model``."""
    done = subprocess.run(
        [*hostler_command(), "preview", model, "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout)["reserved_bytes"])


def prepare(folder: Path, source: Path, names: list[str], slots: int) -> dict[str, Path]:
    """The folder with its models (B a copy of A under another name) and its config."""
    folder.mkdir(parents=True)
    models: dict[str, Path] = {}
    for name in names:
        models[name] = folder / f"{name}.gguf"
        shutil.copyfile(source, models[name])
    write_config(folder, models, slots)
    return models


def router_folder(folder: Path, models: dict[str, Path]) -> Path:
    """The router's models folder: hard links to the very files hostler serves."""
    router_dir = folder / "router-models"
    router_dir.mkdir()
    for path in models.values():
        os.link(path, router_dir / path.name)
    return router_dir


def new_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def read_token(folder: Path) -> str:
    return (folder / "data" / "token").read_text(encoding="utf-8").strip()


async def start_setup(
    reaper: Reaper,
    http: httpx.AsyncClient,
    folder: Path,
    source: Path,
    names: list[str],
    slots: int,
    *,
    budget_for_one: bool,
) -> Setup:
    models = prepare(folder, source, names, slots)
    config = folder / "hostler.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTLER_")}
    env["HOSTLER_LLAMA_SERVER"] = str(find_llama_server())
    if budget_for_one:
        prices = {name: preview_price(config, name) for name in names}
        budget = BUDGET_FACTOR * max(prices.values())
        env["HOSTLER_CAPACITY_BUDGET_GB"] = f"{budget / GIB:.6f}"
        shown = ", ".join(f"{n} {p / 2**20:.0f} MiB" for n, p in prices.items())
        print(f"  prices (hostler preview): {shown}; budget {budget / 2**20:.0f} MiB")
    port = free_port()
    argv = [*hostler_command(), "serve", "--config", str(config), "--port", str(port)]
    proc = reaper.spawn(argv, folder / "serve.log", env=env)
    hostler = Hostler(proc, f"http://127.0.0.1:{port}", folder)
    await wait_health(http, hostler.base, proc)
    hostler.token = read_token(folder)

    # one request loads a, and tells which argv hostler launches its engine with
    client = openai_client(hostler.base)
    await latency(client, names[0])
    engine = (await hostler.running(http))[0]
    reaper.note(engine["pid"])
    cmdline = psutil.Process(engine["pid"]).cmdline()
    engine_argv = cmdline[1:]

    router_dir = router_folder(folder, models)
    per_model = strip_flags(engine_argv, {"--model", "--host", "--port", "--slot-save-path"})
    router_slots = new_dir(folder / "router-slots")
    router_port = free_port()
    router_argv = [
        str(find_llama_server()),
        "--models-dir", str(router_dir),
        "--models-max", "1",
        "--host", "127.0.0.1",
        "--port", str(router_port),
        "--slot-save-path", str(router_slots),
        *per_model,
    ]  # fmt: skip
    router_proc = reaper.spawn(router_argv, folder / "router.log")
    router = Router(router_proc, f"http://127.0.0.1:{router_port}")
    await wait_health(http, router.base, router_proc)
    return Setup(hostler, router, engine_argv, models)


def direct_argv(setup: Setup, port: int, slot_dir: Path) -> list[str]:
    argv = replace_value(setup.engine_argv, "--port", str(port))
    argv = replace_value(argv, "--slot-save-path", str(slot_dir))
    return [str(find_llama_server()), *argv]


# -- requests (the openai client, the same for every candidate) -------------------------------


def openai_client(base: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)


async def latency(client: AsyncOpenAI, model: str) -> float:
    """One non-streamed request, ``max_tokens`` 1: seconds."""
    start = time.perf_counter()
    await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1, temperature=0, extra_body=EXTRA
    )
    return time.perf_counter() - start


async def streamed(
    client: AsyncOpenAI, model: str, tokens: int = STREAM_TOKENS
) -> tuple[float, float]:
    """One streamed request: (seconds to the response headers, to the first content chunk)."""
    start = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=tokens,
        temperature=0,
        stream=True,
        extra_body=EXTRA,
    )
    headers = time.perf_counter() - start
    first: float | None = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    if first is None:
        raise RuntimeError(f"{model}: no content chunk")
    return headers, first


async def concurrent(client: AsyncOpenAI, model: str) -> float:
    """16 streams at once, 32 tokens each: content chunks per second."""
    counts: list[int] = []

    async def one() -> None:
        stream = await client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=CONCURRENT_TOKENS,
            temperature=0,
            stream=True,
            extra_body=EXTRA,
        )
        n = 0
        async for chunk in stream:
            n += bool(chunk.choices and chunk.choices[0].delta.content)
        counts.append(n)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(CONCURRENT)))
    return sum(counts) / (time.perf_counter() - start)


async def tried(who: str, make: Callable[[], Awaitable[T]], tries: int = 3) -> T:
    """``make()``, again after a connection failure (counted in :data:`FAILURES`)."""
    for attempt in range(tries):
        try:
            return await make()
        except APIConnectionError as exc:
            FAILURES[who] = FAILURES.get(who, 0) + 1
            print(f"  {who}: connection failed ({exc.__cause__!r}); again", file=sys.stderr)
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


def in_order(names: list[str], round_no: int) -> list[str]:
    """Forward in even rounds, reversed in odd ones."""
    return names if round_no % 2 == 0 else names[::-1]


# -- part 1: the engines ------------------------------------------------------------------------

Samples = dict[str, dict[str, list[float]]]


def record(samples: Samples, metric: str, who: str, value: float) -> None:
    samples.setdefault(metric, {}).setdefault(who, []).append(value)


async def steady_part(
    args: argparse.Namespace,
    reaper: Reaper,
    http: httpx.AsyncClient,
    folder: Path,
    source: Path,
    samples: Samples,
) -> None:
    print("steady: hostler serve, router and direct, model a, 16 slots", file=sys.stderr)
    setup = await start_setup(
        reaper, http, folder, source, ["a"], STEADY_SLOTS, budget_for_one=False
    )
    port = free_port()
    argv = direct_argv(setup, port, new_dir(folder / "direct-slots"))
    direct = reaper.spawn(argv, folder / "direct.log")
    base = f"http://127.0.0.1:{port}"
    await wait_health(http, base, direct)
    clients = {
        "direct": openai_client(base),
        "hostler": openai_client(setup.hostler.base),
        "router": openai_client(setup.router.base),
    }
    for client in clients.values():  # warm every path (the router loads its child here)
        for _ in range(3):
            await tried("warm-up", partial(latency, client, "a"))
    names = list(clients)
    for r in range(args.rounds):
        print(f"  steady round {r + 1}/{args.rounds}", file=sys.stderr)
        for who in in_order(names, r):
            client = clients[who]
            lat = [await tried(who, partial(latency, client, "a")) for _ in range(args.inner)]
            record(samples, "warm_latency", who, statistics.median(lat))
            timings = [await tried(who, partial(streamed, client, "a")) for _ in range(args.inner)]
            record(samples, "stream_headers", who, statistics.median(t[0] for t in timings))
            record(samples, "stream_first_chunk", who, statistics.median(t[1] for t in timings))
        for who in in_order(names, r):
            record(
                samples,
                "concurrent16",
                who,
                await tried(who, partial(concurrent, clients[who], "a")),
            )
    for client in clients.values():
        await client.close()
    reaper.stop(direct)
    await stop_setup(reaper, setup)


async def stop_setup(reaper: Reaper, setup: Setup) -> None:
    reaper.stop(setup.router.proc)
    reaper.stop(setup.hostler.proc)


async def cold_direct(http: httpx.AsyncClient, reaper: Reaper, setup: Setup, folder: Path) -> float:
    port = free_port()
    slots = new_dir(folder / f"direct-slots-{port}")
    base = f"http://127.0.0.1:{port}"
    client = openai_client(base)
    start = time.perf_counter()
    proc = reaper.spawn(direct_argv(setup, port, slots), folder / "direct.log")
    try:
        await wait_health(http, base, proc)
        await streamed(client, "a")
        took = time.perf_counter() - start
    finally:
        await client.close()
        reaper.stop(proc)
    return took


async def swap_part(
    args: argparse.Namespace,
    reaper: Reaper,
    http: httpx.AsyncClient,
    folder: Path,
    source: Path,
    samples: Samples,
) -> None:
    print("swap: hostler serve and router, models a and b, room for one", file=sys.stderr)
    setup = await start_setup(
        reaper, http, folder, source, ["a", "b"], SWAP_SLOTS, budget_for_one=True
    )
    clients = {
        "hostler": openai_client(setup.hostler.base),
        "router": openai_client(setup.router.base),
    }
    await cold_rounds(args, reaper, http, folder, setup, clients, samples)
    await swap_rounds(args, reaper, http, setup, clients, samples)
    for client in clients.values():
        await client.close()
    await stop_setup(reaper, setup)


def watched(setup: Setup, who: str) -> tuple[int, bool]:
    """Whose CPU counts: hostler's daemon and its non-engine children; the router's parent."""
    if who == "hostler":
        return setup.hostler.proc.pid, True
    return setup.router.proc.pid, False


async def cold_rounds(
    args: argparse.Namespace,
    reaper: Reaper,
    http: httpx.AsyncClient,
    folder: Path,
    setup: Setup,
    clients: dict[str, AsyncOpenAI],
    samples: Samples,
) -> None:
    """2. A cold request until its first content chunk (model a stopped everywhere before)."""
    hostler, router = setup.hostler, setup.router
    names = ["direct", "hostler", "router"]
    for r in range(args.rounds):
        print(f"  cold round {r + 1}/{args.rounds}", file=sys.stderr)
        for who in in_order(names, r):
            await hostler.unload_all(http)  # nothing runs anywhere before a cold request
            await router.unload_all(http)
            if who == "direct":
                record(
                    samples, "cold_first_token", who, await cold_direct(http, reaper, setup, folder)
                )
                continue
            pid, children = watched(setup, who)
            cpu0 = daemon_cpu(pid, children=children)
            start = time.perf_counter()
            await tried(who, partial(streamed, clients[who], "a"))  # a retry counts in the time
            record(samples, "cold_first_token", who, time.perf_counter() - start)
            record(samples, "cold_daemon_cpu", who, daemon_cpu(pid, children=children) - cpu0)
            if who == "hostler":
                for engine in await hostler.running(http):
                    reaper.note(engine["pid"])
    await hostler.unload_all(http)
    await router.unload_all(http)


async def swap_rounds(
    args: argparse.Namespace,
    reaper: Reaper,
    http: httpx.AsyncClient,
    setup: Setup,
    clients: dict[str, AsyncOpenAI],
    samples: Samples,
) -> None:
    """1 and 3. Blocks of requests alternating b, a, ...: each evicts the other model."""
    hostler, router = setup.hostler, setup.router
    for client in clients.values():  # a loaded in both, nothing else
        await tried("warm-up", partial(latency, client, "a"))
    expected_argv = strip_flags(setup.engine_argv, {"--model", "--port", "--slot-save-path"})
    for r in range(args.rounds):
        print(f"  swap round {r + 1}/{args.rounds}", file=sys.stderr)
        for who in in_order(["hostler", "router"], r):
            pid, children = watched(setup, who)
            before = await hostler.evictions(http) if who == "hostler" else 0
            models = ["b", "a"] * (args.swaps // 2)
            took: list[float] = []
            cpu0 = daemon_cpu(pid, children=children)
            for model in models:
                took.append(await tried(who, partial(latency, clients[who], model)))
            cpu = daemon_cpu(pid, children=children) - cpu0
            record(samples, "swap_wall", who, statistics.mean(took))
            record(samples, "swap_daemon_cpu", who, cpu / len(models))
            if who == "hostler":
                await check_hostler_swaps(
                    http, reaper, hostler, before + len(models), expected_argv
                )
            else:
                states = await router.loaded(http)
                if states.get("a") != "loaded" or states.get("b") == "loaded":
                    raise RuntimeError(f"the router holds {states} after a block of swaps")


async def check_hostler_swaps(
    http: httpx.AsyncClient, reaper: Reaper, hostler: Hostler, wanted: int, argv: list[str]
) -> None:
    """Every request of the block evicted the other model, and the engine kept its flags."""
    deadline = time.monotonic() + 5
    count = await hostler.evictions(http)
    while count < wanted and time.monotonic() < deadline:  # the metrics fold may lag a little
        await asyncio.sleep(0.1)
        count = await hostler.evictions(http)
    if count != wanted:
        raise RuntimeError(f"hostler evicted {count} times, {wanted} expected: no swap per request")
    running = await hostler.running(http)
    if [e["key"] for e in running] != ["llamacpp:a:0"]:
        raise RuntimeError(f"hostler runs {[e['key'] for e in running]}, not only a")
    reaper.note(running[0]["pid"])
    now = psutil.Process(running[0]["pid"]).cmdline()[1:]
    if strip_flags(now, {"--model", "--port", "--slot-save-path"}) != argv:
        raise RuntimeError(f"hostler's engine flags changed: {now}")


# -- part 2: the log ----------------------------------------------------------------------------


def log_part(args: argparse.Namespace, folder: Path, samples: Samples) -> None:
    folder.mkdir(parents=True)
    print(f"log: {args.appends} paired appends", file=sys.stderr)
    raw = raw_connect(folder / "raw.db")
    with EventStore.open(folder / "hostler.db", owner=True) as store:

        def hostler_append(i: int) -> float:
            start = time.perf_counter()
            store.append("s/h", [payload(i)], expected_version=i)
            return time.perf_counter() - start

        def raw_append(i: int) -> float:
            start = time.perf_counter()
            raw.execute("BEGIN IMMEDIATE")
            raw.execute(INSERT, raw_row("s/raw", i + 1, payload(i), now_stamp()))
            raw.execute("COMMIT")
            return time.perf_counter() - start

        for i in range(args.warmup_appends):  # not measured: first pages, caches
            hostler_append(i)
            raw_append(i)
        for n in range(args.appends):
            i = args.warmup_appends + n
            pair = {
                "hostler": lambda i=i: hostler_append(i),
                "raw sqlite3": lambda i=i: raw_append(i),
            }
            for who in in_order(list(pair), n):
                record(samples, "append", who, pair[who]())
    raw.close()

    log = folder / "replay.db"
    print(
        f"log: replay of {args.replay_events:,} events, {args.replay_rounds} rounds",
        file=sys.stderr,
    )
    build_lifecycle_log(log, args.replay_events)

    def hostler_replay() -> float:
        with EventStore.open(log) as replay_store:
            start = time.perf_counter()
            world = replay(replay_store)
            took = time.perf_counter() - start
        assert world.events == args.replay_events, world.events
        return took

    def raw_fetch() -> float:
        conn = sqlite3.connect(log)
        start = time.perf_counter()
        loads = json.loads
        for row in conn.execute(
            "SELECT seq, stream_id, version, type, schema_version, payload FROM events ORDER BY seq"
        ):
            loads(row[5])
        took = time.perf_counter() - start
        conn.close()
        return took

    replays: dict[str, Callable[[], float]] = {"hostler": hostler_replay, "raw sqlite3": raw_fetch}
    for r in range(args.replay_rounds):
        for who in in_order(list(replays), r):
            record(samples, "replay", who, replays[who]())


# -- report --------------------------------------------------------------------------------------


def ratios(samples: Samples, metric: str, who: str, base: str) -> list[float]:
    """Per-round ratios; a round whose base is 0 (a CPU figure under one clock tick) has none."""
    ours, theirs = samples[metric][who], samples[metric][base]
    return [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]


def ratio_text(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"**{statistics.median(values):.3f}×** [{min(values):.2f}–{max(values):.2f}]"


def added_ms(samples: Samples, metric: str, who: str, base: str) -> str:
    ours, theirs = samples[metric][who], samples[metric][base]
    return f"{statistics.median((a - b) * 1000 for a, b in zip(ours, theirs, strict=True)):+.2f} ms"


def med(samples: Samples, metric: str, who: str, unit: str) -> str:
    values = samples.get(metric, {}).get(who)
    if not values:
        return ""
    value = statistics.median(values)
    if unit == "ms":
        return f"{value * 1000:.1f} ms"
    if unit == "cpu":
        return f"{value:.4f} s"
    return f"{value:,.1f}"


def engines_table(samples: Samples) -> Iterator[str]:
    yield "| metric | direct | hostler | router | hostler / direct | router / direct | hostler / router | added by hostler (vs direct) |"
    yield "|---|---:|---:|---:|---:|---:|---:|---:|"
    rows = [
        ("daemon CPU per swapped request (CPU-s)", "swap_daemon_cpu", "cpu"),
        ("swap A↔B wall per request", "swap_wall", "ms"),
        ("cold request → first token", "cold_first_token", "ms"),
        ("daemon CPU per cold request (CPU-s)", "cold_daemon_cpu", "cpu"),
        ("stream: response headers (warm)", "stream_headers", "ms"),
        ("stream: first content chunk (warm)", "stream_first_chunk", "ms"),
        ("warm latency, not streamed, max_tokens 1", "warm_latency", "ms"),
        (f"{CONCURRENT} concurrent streams (chunks/s)", "concurrent16", "rate"),
    ]
    for label, metric, unit in rows:
        by = samples.get(metric)
        if not by:
            continue
        has_direct = "direct" in by
        cells = [med(samples, metric, who, unit) for who in ("direct", "hostler", "router")]
        h_d = ratio_text(ratios(samples, metric, "hostler", "direct")) if has_direct else ""
        r_d = ratio_text(ratios(samples, metric, "router", "direct")) if has_direct else ""
        h_r = ratio_text(ratios(samples, metric, "hostler", "router"))
        add = added_ms(samples, metric, "hostler", "direct") if has_direct and unit == "ms" else ""
        yield f"| {label} | {' | '.join(cells)} | {h_d} | {r_d} | {h_r} | {add} |"
    if "swap_daemon_cpu" in samples:
        cpu = statistics.median(samples["swap_daemon_cpu"]["hostler"])
        mark = "✔" if round(cpu, 6) <= CPU_GOAL else "✘"
        router = statistics.median(samples["swap_daemon_cpu"]["router"])
        yield ""
        yield (
            f"daemon CPU per swapped request: hostler {cpu:.4f} CPU-s (goal ≤ {CPU_GOAL} {mark}), "
            f"router {router:.4f} CPU-s"
        )


def log_table(samples: Samples) -> Iterator[str]:
    yield "| operation | raw sqlite3 | hostler | hostler / raw (median of paired ratios) | added |"
    yield "|---|---:|---:|---:|---:|"
    for label, metric in (
        ("durable single append (one fsync'd commit)", "append"),
        ("replay vs raw fetch + json.loads", "replay"),
    ):
        if metric not in samples:
            continue
        raw = statistics.median(samples[metric]["raw sqlite3"]) * 1000
        ours = statistics.median(samples[metric]["hostler"]) * 1000
        yield (
            f"| {label} | {raw:.3f} ms | {ours:.3f} ms | "
            f"{ratio_text(ratios(samples, metric, 'hostler', 'raw sqlite3'))} | "
            f"{added_ms(samples, metric, 'hostler', 'raw sqlite3')} |"
        )


# -- main -----------------------------------------------------------------------------------------


def model_file(args: argparse.Namespace, folder: Path) -> Path:
    if args.tiny:
        return write_tiny_llama(folder / "tiny.gguf")
    return smollm2_gguf(Path(args.cache) if args.cache else default_data_dir() / "cache")


async def engines_main(
    args: argparse.Namespace, reaper: Reaper, folder: Path, samples: Samples
) -> None:
    source = model_file(args, folder)
    print(
        f"model: {source.name} ({source.stat().st_size / 2**20:.1f} MiB); "
        f"llama-server: {find_llama_server()}",
        file=sys.stderr,
    )
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await steady_part(args, reaper, http, folder / "steady", source, samples)
        await swap_part(args, reaper, http, folder / "swap", source, samples)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of every engine measure")
    parser.add_argument("--inner", type=int, default=5, help="requests per candidate per round")
    parser.add_argument("--swaps", type=int, default=8, help="swap requests per block (even)")
    parser.add_argument("--appends", type=int, default=400, help="paired appends (part 2)")
    parser.add_argument("--replay-events", type=int, default=100_000)
    parser.add_argument("--replay-rounds", type=int, default=6)
    parser.add_argument("--tiny", action="store_true", help="a generated tiny llama, not SmolLM2")
    parser.add_argument("--parts", default="engines,log", help="engines, log, or both")
    parser.add_argument("--quick", action="store_true", help="a smoke run (~2 min)")
    parser.add_argument(
        "--cache", help="where the SmolLM2 F16 copy is kept (default DATA_DIR/cache)"
    )
    parser.add_argument("--keep", help="work in this (new) folder and keep it (logs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.inner, args.swaps = 2, 3, 2
        args.appends, args.replay_events, args.replay_rounds = 60, 10_000, 2
    args.swaps = max(2, args.swaps - args.swaps % 2)
    args.warmup_appends = 10
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    parts = {p.strip() for p in args.parts.split(",")}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    reaper = Reaper()
    samples: Samples = {}
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="hostler-cp-")
    folder = Path(tmp.name) if tmp is not None else Path(args.keep)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        if "engines" in parts:
            asyncio.run(engines_main(args, reaper, folder, samples))
        if "log" in parts:
            log_part(args, folder / "log", samples)
    except KeyboardInterrupt:
        print("interrupted: stopping every process started", file=sys.stderr)
        return 130
    finally:
        reaper.close()
        if tmp is not None:
            tmp.cleanup()
    report = {
        "samples": samples,
        "params": {k: v for k, v in vars(args).items()},
        "seconds": time.monotonic() - started,
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "llama_server": str(find_llama_server()),
        "connection_failures": FAILURES,
        "client": f"openai {__import__('openai').__version__} (AsyncOpenAI); httpx for operator calls",
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "control_plane.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    if "engines" in parts:
        print(
            f"\n## Engines ({args.rounds} rounds; model {'tiny' if args.tiny else 'SmolLM2-135M F16'})\n"
        )
        print("\n".join(engines_table(samples)))
        print(f"\nrequests that failed on the connection and were retried: {FAILURES or 'none'}")
    if "log" in parts:
        print(
            f"\n## Event log ({args.appends} paired appends; {args.replay_rounds} replays of {args.replay_events:,} events)\n"
        )
        print("\n".join(log_table(samples)))
    print(
        f"\n(took {report['seconds']:.0f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
