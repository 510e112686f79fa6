"""A conversation's next turn after its engine was evicted and reloaded: hostler vs the router.

Issue 20, measured from outside: ``hostler serve`` (the CLI a user runs) and llama.cpp's own
router mode (the same ``llama-server``, started with no model and ``--models-max 1``) serve the
same two model files (B a copy of A), each with the same engine flags, two slots of ``--ctx``
tokens each. For each prompt size and trial, on each candidate (order alternating by trial):

1. session X: turn 1 (the prompt), turn 2, turn 3 — never evicted: turn 3 is the reference;
2. session Y: turn 1 (another prompt of the same size), turn 2;
3. a one-shot request for B (it evicts A), then one for A (A reloaded; no session);
4. session Y: turn 3 — the measured turn.

The figure is Y's turn 3 over X's turn 3 (wall time of the request through the official
``openai`` client), per candidate; the goal is ≤ 1.5× for hostler. The router keeps nothing
across a swap: its Y turn 3 reads its whole prompt again. ``timings.prompt_n`` (tokens the
engine evaluated) is reported beside. The save's own cost inside the swap is in the swap of
step 3 (``bench/control_plane.py`` measures swaps).

    python3 dev.py run python bench/session_cache.py                 # 1k, 3k, 8k; 2 trials
    python3 dev.py run python bench/session_cache.py --sizes 1000 --trials 1   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from openai import AsyncOpenAI

from control_plane import (
    FAILURES,
    GIB,
    Reaper,
    free_port,
    hostler_command,
    preview_price,
    router_folder,
    strip_flags,
    tried,
    wait_health,
    write_config,
)
from hostler.paths import default_data_dir
from hostler.testing.smollm2 import smollm2_gguf
from hostler_llamacpp.binary import find_llama_server

OUT = Path(__file__).parent / "out"
BUDGET_FACTOR = 1.4  # room for one engine of the two, never both
SLOTS = 2
#: A sentence of about 24 tokens (numbered) in SmolLM2's chat template; a prompt holds as many as
#: its size asks.
SENTENCE = "The river runs past the mill, under the old stone bridge, and on to the sea."


def prompt(tokens: int, tag: str) -> str:
    """About ``tokens`` tokens of text, starting with ``tag`` (no two prompts share a prefix)."""
    return f"[{tag}] " + " ".join(f"{n}. {SENTENCE}" for n in range(max(1, tokens // 24)))


def _files(folder: Path, ctx: int) -> tuple[dict[str, Path], Path]:
    """The two model files (B a copy of A) and hostler's config, in a new ``folder``."""
    source = smollm2_gguf(default_data_dir() / "cache")
    folder.mkdir(parents=True)
    models = {name: folder / f"{name}.gguf" for name in ("a", "b")}
    for path in models.values():
        shutil.copyfile(source, path)
    return models, write_config(folder, models, SLOTS, ctx)


async def start(reaper: Reaper, http: httpx.AsyncClient, folder: Path, ctx: int) -> dict[str, str]:
    """``hostler serve`` and the router on the same files and flags; their base URLs."""
    models, config = await asyncio.to_thread(_files, folder, ctx)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTLER_")}
    env["HOSTLER_LLAMA_SERVER"] = str(find_llama_server())
    budget = BUDGET_FACTOR * max(preview_price(config, name) for name in models)
    env["HOSTLER_CAPACITY_BUDGET_GB"] = f"{budget / GIB:.6f}"
    port = free_port()
    argv = [*hostler_command(), "serve", "--config", str(config), "--port", str(port)]
    proc = reaper.spawn(argv, folder / "serve.log", env=env)
    hostler = f"http://127.0.0.1:{port}"
    await wait_health(http, hostler, proc)
    # one request loads a and tells the argv hostler launches its engines with
    await turn(AsyncOpenAI(base_url=f"{hostler}/v1", api_key="-", max_retries=0), "a", [], None)
    engines = (await http.get(f"{hostler}/api/engines")).json()["engines"]
    pid = next(e["pid"] for e in engines if e["state"] == "running")
    reaper.note(pid)
    flags = strip_flags(
        psutil.Process(pid).cmdline()[1:], {"--model", "--host", "--port", "--slot-save-path"}
    )
    router_port = free_port()
    router_argv = [
        str(find_llama_server()), "--models-dir", str(router_folder(folder, models)),
        "--models-max", "1", "--host", "127.0.0.1", "--port", str(router_port), *flags,
    ]  # fmt: skip
    router_proc = reaper.spawn(router_argv, folder / "router.log")
    router = f"http://127.0.0.1:{router_port}"
    await wait_health(http, router, router_proc)
    return {"hostler": hostler, "router": router}


async def turn(
    client: AsyncOpenAI, model: str, history: list[Any], session: str | None
) -> tuple[float, int]:
    """One turn (its answer appended to ``history``): wall seconds, tokens evaluated."""
    messages = history or [{"role": "user", "content": "hi"}]

    async def ask() -> Any:
        return await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=8,
            temperature=0,
            **({"user": session} if session else {}),
        )

    began = time.perf_counter()
    # the router sometimes drops a connection unanswered: asked again (and counted), as
    # bench/control_plane.py does
    answer = await tried(str(client.base_url), ask)
    took = time.perf_counter() - began
    if history:
        history.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
    timings = (answer.model_extra or {}).get("timings") or {}
    return took, int(timings.get("prompt_n", -1))


async def trial(client: AsyncOpenAI, size: int, tag: str) -> dict[str, float]:
    """Steps 1 to 4 on one candidate: the reference turn and the measured one."""
    x: list[Any] = [{"role": "user", "content": prompt(size, f"{tag}-x")}]
    y: list[Any] = [{"role": "user", "content": prompt(size, f"{tag}-y")}]
    for history, session in ((x, f"{tag}-x"), (y, f"{tag}-y")):
        for question in ("", "Say more."):
            if question:
                history.append({"role": "user", "content": question})
            await turn(client, "a", history, session)
    x.append({"role": "user", "content": "And then?"})
    reference, reference_n = await turn(client, "a", x, f"{tag}-x")
    await turn(client, "b", [], None)  # evicts a
    await turn(client, "a", [], None)  # a is back, no session asked for it
    y.append({"role": "user", "content": "And then?"})
    measured, measured_n = await turn(client, "a", y, f"{tag}-y")
    return {
        "reference_s": reference,
        "measured_s": measured,
        "ratio": measured / reference,
        "reference_prompt_n": reference_n,
        "measured_prompt_n": measured_n,
    }


async def run(args: argparse.Namespace, reaper: Reaper, folder: Path) -> dict[str, Any]:
    ctx = max(args.sizes) + 1024
    async with httpx.AsyncClient(timeout=60) as http:
        bases = await start(reaper, http, folder / "serve", ctx)
    clients = {
        who: AsyncOpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0, timeout=900)
        for who, base in bases.items()
    }
    samples: dict[str, dict[str, list[dict[str, float]]]] = {}
    for size in args.sizes:
        for number in range(args.trials):
            order = ["hostler", "router"] if number % 2 == 0 else ["router", "hostler"]
            for who in order:
                print(f"  {size} tokens, trial {number + 1}/{args.trials}: {who}", file=sys.stderr)
                got = await trial(clients[who], size, f"{size}-{number}")
                samples.setdefault(str(size), {}).setdefault(who, []).append(got)
    return samples


def table(samples: dict[str, dict[str, list[dict[str, float]]]]) -> list[str]:
    rows = [
        "| prompt | who | turn 3, never evicted | turn 3 after evict + reload | ratio (median) "
        "[min–max] | tokens evaluated (never evicted → after) | goal |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for size, by_who in samples.items():
        for who, runs in by_who.items():
            ratios = [r["ratio"] for r in runs]
            reference = statistics.median(r["reference_s"] for r in runs)
            measured = statistics.median(r["measured_s"] for r in runs)
            tokens = (
                f"{statistics.median(r['reference_prompt_n'] for r in runs):.0f} → "
                f"{statistics.median(r['measured_prompt_n'] for r in runs):.0f}"
            )
            ratio = statistics.median(ratios)
            goal = ("✔" if ratio <= 1.5 else "✘") if who == "hostler" else ""
            rows.append(
                f"| {size} | {who} | {reference * 1000:.0f} ms | {measured * 1000:.0f} ms | "
                f"**{ratio:.2f}×** [{min(ratios):.2f}–{max(ratios):.2f}] | {tokens} | "
                f"{'≤ 1.5×: ' + goal if goal else ''} |"
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 8000])
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    reaper = Reaper()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostler-sessions-") as tmp:
        try:
            samples = asyncio.run(run(args, reaper, Path(tmp)))
        except KeyboardInterrupt:
            print("interrupted: stopping every process started", file=sys.stderr)
            return 130
        finally:
            reaper.close()
    took = time.monotonic() - started
    OUT.mkdir(exist_ok=True)
    report = {
        "samples": samples,
        "seconds": took,
        "loadavg": os.getloadavg(),
        "connection_failures": FAILURES,
    }
    (OUT / "session_cache.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    print("\n".join(table(samples)))
    print(f"\nrequests that failed on the connection and were asked again: {FAILURES or 'none'}")
    print(f"\n(took {took:.0f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
