"""The live demo: a real llama-server, supervised, crashed, restarted and stopped, all logged.

It makes a tiny model (or uses ``--model``), plans it against this host's budget, reserves it
in a demo ledger, starts the real engine, asks it a question, kills it with SIGKILL to show a
crash snapshot, restarts it on the next request, and stops it — every step an event.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import anyio

from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState
from hostler.capacity.units import GIB, MIB, format_half_up
from hostler.daemon_parts.ownership import daemon_id
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.price import LaunchRequest, price_engine
from hostler.engines.reconcile import DAEMON_STREAM, EngineReaped, find_strays, reap
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.machines.engine import StopReason
from hostler.plugin import LaunchSpec
from hostler.pluginhost import PluginHost
from hostler.probes.device import budget_from, sample_device
from hostler.probes.nvml import open_nvml
from hostler.store.log import EventStore
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama

__all__ = ["run_live"]

KEY = "llamacpp:demo-tiny:0"


def _ask(port: int, question: str) -> str:
    body = json.dumps(
        {"messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 12}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback only
        reply = json.loads(response.read())
    return str(reply["choices"][0]["message"]["content"])


def run_live(store: EventStore, demo_dir: Path, model: Path | None, say: Say) -> None:
    """Run the live story into ``store``."""
    if model is None:
        model = demo_dir / "models" / "tiny-llama.gguf"
        if not model.exists():
            model.parent.mkdir(parents=True, exist_ok=True)
            write_tiny_llama(model, TinyModel(layers=4, embd=256, heads=4, kv_heads=2, ff=768))
            say(f"made a tiny random-weight model: {model} ({model.stat().st_size // 1024} KiB)")
    adapter = PluginHost().load().adapter("llamacpp")
    geometry = adapter.read_geometry(model)
    probe = open_nvml()
    sample = sample_device(probe, at=time.time())
    probe.close()
    budget = budget_from(sample)
    # the one price: what `hostler preview` shows and what the ledger will hold
    price = price_engine(
        adapter,
        LaunchRequest(KEY, model, ctx=2048, slots=2, kv_type="f16"),
        budget=budget,
        state=LedgerState(),
        calibration=Calibration(),
        geometry=geometry,
    ).price
    plan = price.plan
    say(
        f"plan: {plan.context_window} tokens × {plan.slots} slots, KV {plan.kv_type}; reserves "
        f"{format_half_up(price.reserved_bytes, 1, per=MIB)} MiB, as `hostler preview` shows "
        f"(budget {format_half_up(budget.budget, 1, per=GIB)} GiB)"
    )

    def spec(port: int) -> LaunchSpec:
        return LaunchSpec(
            KEY, model, port, plan.context_window, plan.slots, plan.kv_type, demo_dir / "work"
        )

    token_prefix = daemon_id(demo_dir)  # kept across runs: a later run reaps what this leaves
    reaped = anyio.run(_reap_earlier_runs, store, token_prefix)
    if reaped:
        say(f"reaped {reaped} engine(s) an interrupted earlier demo left running (daemon.reaped)")
    with EventStore.open(demo_dir / "ledger.db") as ledger_store:
        ledger = HostLedger(ledger_store, OwnerIdentity.current("hostler-demo"), lambda: budget)
        supervisor = Supervisor(
            KEY,
            adapter,
            spec,
            store,
            run_dir=demo_dir / "run",
            token_prefix=token_prefix,
            policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=1.0),
            ledger=ledger,
            footprint=lambda: price.reserved_bytes,
        )
        anyio.run(_story, supervisor, say)
        held = ledger.snapshot()["committed"]
        decisions = len(ledger_store.read_stream("ledger/host"))
        say(
            f"the demo ledger ({demo_dir / 'ledger.db'}) recorded {decisions} decisions; "
            f"{held} bytes held now (every reservation released)"
        )


async def _reap_earlier_runs(store: EventStore, token_prefix: str) -> int:
    """Stop engines an interrupted earlier demo (Ctrl-C, SIGKILL) left behind; record each."""
    strays = await anyio.to_thread.run_sync(lambda: find_strays(token_prefix, exclude=set()))
    for stray in strays:
        await reap(stray)
        store.append(
            DAEMON_STREAM,
            [EngineReaped(time.time(), stray.pid, stray.token, stray.command)],
            expected_version=None,
            metadata={"actor": "demo"},
        )
    return len(strays)


async def _story(supervisor: Supervisor, say: Say) -> None:
    started = time.perf_counter()
    async with supervisor.request() as port:
        say(
            f"llama-server pid {supervisor.pid} ready on 127.0.0.1:{port} in "
            f"{(time.perf_counter() - started) * 1000:.0f} ms"
        )
        answer = await anyio.to_thread.run_sync(_ask, port, "The capital of France is")
        say(f"it answered (random weights, so nonsense): {answer!r}")
    pid = supervisor.pid
    assert pid is not None  # noqa: S101 - it just answered
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(supervisor.watch)
        os.kill(pid, signal.SIGKILL)
        say(f"sent SIGKILL to pid {pid} …")
        while supervisor.state != "backoff":  # noqa: ASYNC110 - the watcher changes it
            await anyio.sleep(0.05)
        say("… the supervisor recorded the crash with its snapshot (engine.crashed)")
        async with supervisor.request() as port:
            say(f"the next request restarted it: pid {supervisor.pid} on port {port}")
        say("idle for a second …")
        while supervisor.state != "stopped":  # noqa: ASYNC110 - the watcher changes it
            await anyio.sleep(0.05)
        say("… stopped for being idle (engine.stop_requested, reason idle)")
        tasks.cancel_scope.cancel()
    await supervisor.stop(StopReason.USER)


class Say:
    """Prints a numbered line per step."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self, text: str) -> None:
        self.step += 1
        print(f"{self.step:>2}. {text}", flush=True)
