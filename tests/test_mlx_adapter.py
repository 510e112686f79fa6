"""The MLX adapter's pure parts: config.json geometry, pricing, argv, readiness, fatal lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hostler.capacity.slots import compute_headroom
from hostler.errors import ModelFileError
from hostler.plugin import LaunchSpec, ModelGeometry, launch_command
from hostler.testing.tiny_mlx import TinyMlxModel, write_tiny_mlx
from hostler_mlx import MlxAdapter
from hostler_mlx.adapter import BOOTSTRAP, OFFLINE_ENV, PROBE_BODY, mlx_argv
from hostler_mlx.geometry import (
    LINEAR_WINDOW,
    Quantization,
    geometry_from_config,
    quantization_from_config,
    read_mlx_model,
)
from hostler_mlx.pricing import (
    KV_TYPE,
    MLX_HEADROOM,
    RUNTIME_BYTES,
    estimate_mlx,
    geometry_known,
    weights_resident,
)

from _support import assert_one_line_error, cli_env, run_cli

MIB = 1024**2
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "max_position_embeddings": 2048,
    "vocab_size": 49,
}


# -- constants, pinned by value ---------------------------------------------------------------


def test_constants() -> None:
    assert MLX_HEADROOM == 0.35
    assert MlxAdapter.kv_headroom == 0.35
    assert compute_headroom("mlx") == 0.35  # hostler's own figure agrees with the adapter's
    assert KV_TYPE == "f16"
    assert RUNTIME_BYTES == 1024 * MIB
    assert LINEAR_WINDOW == 1024
    assert MlxAdapter.engine_type == "mlx"
    assert MlxAdapter.model_kind == "directory"
    assert MlxAdapter.readiness_path == "/health"
    assert OFFLINE_ENV["HF_HUB_OFFLINE"] == "1"
    assert OFFLINE_ENV["TRANSFORMERS_OFFLINE"] == "1"


# -- geometry (M10) -----------------------------------------------------------------------------


def test_full_attention_geometry() -> None:
    g = geometry_from_config(LLAMA, weights=1000)
    assert (g.architecture, g.block_count, g.head_count, g.head_count_kv) == ("llama", 2, 4, 2)
    assert (g.key_length, g.value_length) == (16, 16)  # hidden / heads
    assert g.swa_pattern is None and g.sliding_window is None
    assert (g.native_context, g.vocab_size, g.file_size) == (2048, 49, 1000)


def test_head_dim_wins_over_hidden_by_heads_and_kv_heads_default_to_heads() -> None:
    config = {**LLAMA, "head_dim": 128}
    del config["num_key_value_heads"]
    g = geometry_from_config(config, weights=0)
    assert (g.key_length, g.head_count_kv) == (128, 4)


def test_text_config_is_read_when_present() -> None:
    g = geometry_from_config({"model_type": "vlm", "text_config": LLAMA}, weights=5)
    assert (g.block_count, g.head_count_kv, g.architecture) == (2, 2, "llama")


def test_windowed_layout_from_layer_types() -> None:
    config = {
        **LLAMA,
        "num_hidden_layers": 3,
        "head_dim": 8,
        "layer_types": ["sliding_attention", "full_attention", "linear_attention"],
        "sliding_window": 512,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
    }
    g = geometry_from_config(config, weights=0)
    assert g.swa_pattern == (True, False, True)
    assert g.sliding_window == 512
    assert g.head_count_kv == (2, 1, 2)
    assert (g.key_length, g.key_length_swa) == (32, 8)


def test_linear_layers_default_to_a_1024_window() -> None:
    config = {**LLAMA, "layer_types": ["linear_attention", "full_attention"]}
    g = geometry_from_config(config, weights=0)
    assert g.sliding_window == 1024
    assert g.swa_pattern == (True, False)


def test_layer_types_of_the_wrong_length_or_all_full_are_full_attention() -> None:
    short = geometry_from_config({**LLAMA, "layer_types": ["sliding_attention"]}, weights=0)
    full = geometry_from_config(
        {**LLAMA, "layer_types": ["full_attention", "full_attention"]}, weights=0
    )
    assert short.swa_pattern is None and full.swa_pattern is None


@pytest.mark.parametrize(
    "change",
    [
        {"num_hidden_layers": 0},
        {"num_hidden_layers": -2},
        {"num_hidden_layers": True},
        {"num_hidden_layers": "2"},
        {"num_attention_heads": None},
        {"hidden_size": 65},  # heads do not divide it, and no head_dim
    ],
)
def test_unreadable_geometry_leaves_kv_unknown(change: dict[str, object]) -> None:
    g = geometry_from_config({**LLAMA, **change}, weights=7)
    assert g.block_count is None or g.key_length is None
    assert g.file_size == 7
    assert geometry_known(g) is False


def test_negative_weights_count_as_zero() -> None:
    assert geometry_from_config(LLAMA, weights=-5).file_size == 0


def test_quantization() -> None:
    assert quantization_from_config({"quantization": {"bits": 4, "group_size": 64}}) == (
        Quantization(4, 64)
    )
    assert quantization_from_config(
        {"quantization_config": {"bits": 8, "group_size": 32}}
    ) == Quantization(8, 32)
    assert quantization_from_config({}) is None
    assert quantization_from_config({"quantization": {"bits": 0, "group_size": 64}}) is None
    assert quantization_from_config({"quantization": {"bits": 16, "group_size": 1}}) == (
        Quantization(16, 1)
    )
    assert quantization_from_config({"quantization": {"bits": 17, "group_size": 64}}) is None
    assert quantization_from_config({"quantization": {"bits": 4, "group_size": -1}}) is None


# -- pricing (M5, CB11) -------------------------------------------------------------------------


def test_weights_resident_is_size_plus_2_percent_plus_1_gib() -> None:
    assert weights_resident(0) == 1024 * MIB
    assert weights_resident(100) == 102 + 1024 * MIB
    assert weights_resident(-100) == 1024 * MIB


def test_kv_priced_f16_exactly_from_the_geometry() -> None:
    g = geometry_from_config(LLAMA, weights=0)
    # 2 layers x 2 KV heads x (16 + 16) x 2 bytes = 256 bytes a token, per slot
    assert estimate_mlx(g, ctx_per_slot=1000, slots=1) == 1024 * MIB + 256_000
    assert estimate_mlx(g, ctx_per_slot=1000, slots=3) == 1024 * MIB + 3 * 256_000
    assert estimate_mlx(g, ctx_per_slot=0, slots=0) == 1024 * MIB + 256  # at least 1 and 1


def test_unknown_geometry_prices_one_slot_by_the_heuristic() -> None:
    g = ModelGeometry(file_size=0)
    one = estimate_mlx(g, ctx_per_slot=100, slots=1)
    assert one == 1024 * MIB + 100 * 40 * 1024  # S4's floor, 40 KiB a token at f16
    assert estimate_mlx(g, ctx_per_slot=100, slots=8) == one  # serial: slots do not count


def test_adapter_estimate_is_the_pricing_function(tmp_path: Path) -> None:
    model = write_tiny_mlx(tmp_path / "m")
    adapter = MlxAdapter()
    g = adapter.read_geometry(model)
    spec = LaunchSpec("mlx:m:0", model, 1, ctx_per_slot=512, slots=2, kv_type="q4_0")
    assert adapter.estimate_footprint(g, spec) == estimate_mlx(g, ctx_per_slot=512, slots=2)
    # the kv_type is llama.cpp's: MLX prices f16 whatever it says
    assert adapter.estimate_footprint(g, spec) == adapter.estimate_footprint(
        g, LaunchSpec("mlx:m:0", model, 1, ctx_per_slot=512, slots=2)
    )


# -- the model directory (RD2) -------------------------------------------------------------------


def test_reads_the_tiny_model(tmp_path: Path) -> None:
    model = write_tiny_mlx(tmp_path / "m", TinyMlxModel(layers=3, hidden=32, heads=2, kv_heads=1))
    read = read_mlx_model(model)
    g = read.geometry
    assert (g.block_count, g.head_count, g.head_count_kv, g.key_length) == (3, 2, 1, 16)
    assert g.file_size == (model / "model.safetensors").stat().st_size > 0
    assert read.quantization is None


def test_validate_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = MlxAdapter()
    model = write_tiny_mlx(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    assert adapter.validate_model(Path("m")) == model  # made absolute
    assert adapter.model_identity(model) == "m"
    with pytest.raises(ModelFileError, match="is a file, not a model directory"):
        adapter.validate_model(model / "config.json")
    with pytest.raises(ModelFileError, match="no such model directory"):
        adapter.validate_model(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match=r"no config\.json, not an MLX model directory"):
        adapter.validate_model(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{nope")
    with pytest.raises(ModelFileError, match="not valid JSON"):
        adapter.validate_model(tmp_path / "bad")
    (tmp_path / "bad" / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelFileError, match="not a JSON object"):
        adapter.validate_model(tmp_path / "bad")


# -- the launch (M3, M6, M9, RD5) -----------------------------------------------------------------


def test_argv(tmp_path: Path) -> None:
    model = write_tiny_mlx(tmp_path / "m")
    adapter = MlxAdapter()
    spec = LaunchSpec(
        "mlx:m:0",
        model,
        18090,
        ctx_per_slot=512,
        slots=2,
        options={"prefill_step_size": 256},
        extra_args={"temp": 0.5, "trust-remote-code": True, "pipeline": False},
    )
    command = launch_command(adapter, spec)
    wired = adapter.estimate_footprint(adapter.read_geometry(model), spec)
    assert command.argv == [
        sys.executable, "-c", BOOTSTRAP, str(wired),
        "--model", str(model), "--host", "127.0.0.1", "--port", "18090",
        "--decode-concurrency", "2", "--prompt-concurrency", "2",
        "--prefill-step-size", "256",
        "--temp", "0.5", "--trust-remote-code",
    ]  # fmt: skip
    assert dict(command.env) == dict(OFFLINE_ENV)
    binary = tmp_path / "python"
    assert adapter.build_command(LaunchSpec("k", model, 1, 1, binary=binary)).argv[0] == str(binary)
    # M9/RD8: the reservation is the wired limit (0: nothing wired); none: the estimate
    for reserved, limit in ((1, 1), (7 * 2**30, 7 * 2**30), (None, wired), (0, 0)):
        held = replace(spec, reserved_bytes=reserved)
        assert adapter.build_command(held).argv[3] == str(limit), reserved


def test_serial_when_the_geometry_is_unknown(tmp_path: Path) -> None:
    model = write_tiny_mlx(tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    del config["num_hidden_layers"]
    (model / "config.json").write_text(json.dumps(config))
    argv = MlxAdapter().build_command(LaunchSpec("k", model, 1, 512, slots=4)).argv
    at = argv.index("--decode-concurrency")
    assert argv[at : at + 4] == ["--decode-concurrency", "1", "--prompt-concurrency", "1"]


def test_argv_edges() -> None:
    argv = mlx_argv("py", Path("/m"), 5, wired_limit=-1, concurrency=0, options={})
    assert argv[3] == "0"
    assert argv[-3:] == ["1", "--prompt-concurrency", "1"]


def test_bootstrap_sets_the_wired_limit_and_stops_the_recommended_one() -> None:
    assert "mx.set_wired_limit(int(sys.argv.pop(1)))" in BOOTSTRAP
    assert "maybe_set_recommended_wired_limit=lambda:None" in BOOTSTRAP
    assert "s.ModelProvider.load=lambda p,m,a=None,d=None:f(p,'default_model',a,d)" in BOOTSTRAP
    compile(BOOTSTRAP, "<bootstrap>", "exec")


# -- readiness (RD1, M4) and fatal lines (M11) ----------------------------------------------------


def test_readiness_is_a_one_token_completion(tmp_path: Path) -> None:
    probe = MlxAdapter().readiness(LaunchSpec("k", tmp_path, 1, 1))
    assert (probe.path, probe.method) == ("/v1/chat/completions", "POST")
    assert probe.body == PROBE_BODY
    assert json.loads(PROBE_BODY)["max_tokens"] == 1


def test_ready_response_needs_choices() -> None:
    adapter = MlxAdapter()
    assert adapter.is_ready_response(200, b'{"choices": [{"index": 0}]}') is True
    assert adapter.is_ready_response(200, b'{"status": "ok"}') is False  # /health's answer
    assert adapter.is_ready_response(200, b'{"choices": []}') is False
    assert adapter.is_ready_response(200, b"not json") is False
    assert adapter.is_ready_response(200, b"[1]") is False
    assert adapter.is_ready_response(503, b'{"choices": [1]}') is False
    assert adapter.is_ready_response(299, b'{"choices": [1]}') is True
    assert adapter.is_ready_response(300, b'{"choices": [1]}') is False


def test_fatal_lines() -> None:
    adapter = MlxAdapter()
    panic = adapter.classify_line("ValueError: Model type foo not supported.")
    assert panic is not None and panic.kind == "startup-error"
    panic = adapter.classify_line("huggingface_hub.errors.HFValidationError: Repo id bad")
    assert panic is not None and panic.kind == "startup-error"
    oom = adapter.classify_line("[METAL] Command buffer execution failed: Insufficient Memory")
    assert oom is not None and (oom.kind, oom.priority) == ("out-of-memory", 5)
    assert adapter.classify_line("UserWarning: mlx_lm.server is not recommended") is None
    assert adapter.classify_line("  warnings.warn(") is None
    assert adapter.classify_line("INFO - Starting httpd at 127.0.0.1 on port 8080...") is None


def test_experts() -> None:
    assert geometry_from_config({**LLAMA, "num_local_experts": 8}, weights=0).expert_count == 8
    assert geometry_from_config({**LLAMA, "num_experts": 4}, weights=0).expert_count == 4
    assert geometry_from_config(LLAMA, weights=0).expert_count is None


def test_config_json_up_to_4_mib(tmp_path: Path) -> None:
    text = json.dumps(LLAMA)
    (tmp_path / "config.json").write_text(text + " " * (4 * MIB - len(text)))
    assert read_mlx_model(tmp_path).geometry.block_count == 2  # exactly 4 MiB: read
    (tmp_path / "config.json").write_text(text + " " * (4 * MIB + 1 - len(text)))
    with pytest.raises(ModelFileError, match="larger than 4194304 bytes"):
        read_mlx_model(tmp_path)


GIB = 2**30


def mlx_folder(tmp_path: Path, name: str, config: str | None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(b"\0" * 1024)
    return folder


def test_a_deeply_nested_mlx_config_json_is_one_line_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    """A 400 KiB config.json of nested arrays is a bad model, refused in one line.

    Today json.loads raises RecursionError, which read_config (hostler_mlx.geometry) does not
    catch (it catches ValueError/UnicodeDecodeError only): validate_model raises a raw
    RecursionError and `hostler preview --engine mlx` prints a traceback.
    """
    depth = 200_000
    folder = mlx_folder(tmp_path, "nested", '{"a": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ModelFileError):
        MlxAdapter().validate_model(folder)
    done = run_cli("preview", "--engine", "mlx", "--standalone", str(folder), env=cli_env(tmp_path))
    assert_one_line_error(done)


def test_an_mlx_config_json_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """config.json as a named pipe: refused at once in one line, as a FIFO model file is.

    Today read_config (hostler_mlx.geometry) checks only st_size (0 for a FIFO) and then
    read_bytes() blocks forever: `hostler preview --engine mlx DIR` hangs (and so does
    validate_model at daemon start, for every engine configured after it).
    """
    folder = mlx_folder(tmp_path, "piped", None)
    os.mkfifo(folder / "config.json")
    try:
        done = run_cli(
            "preview", "--engine", "mlx", "--standalone", str(folder),
            env=cli_env(tmp_path), timeout=15,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("hostler preview blocked for 15 s reading a FIFO config.json")
    assert_one_line_error(done)
    assert "fifo" in done.stderr.lower() or "named pipe" in done.stderr.lower()


QWEN_LIKE = {
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 151936,
}


def preview_json(tmp_path: Path, folder: Path, *args: str, budget_gb: int) -> dict[str, object]:
    env = {**cli_env(tmp_path), "HOSTLER_CAPACITY_BUDGET_GB": str(budget_gb)}
    done = run_cli("preview", "--engine", "mlx", "--json", *args, str(folder), env=env)
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_an_mlx_model_that_fits_at_f16_is_admitted_and_planned_at_f16(tmp_path: Path) -> None:
    """MLX holds its KV at f16 (M5); the plan sizes the window at f16, so what fits is admitted.

    A 28-layer model (f16 KV 112 KiB/token) with 300 MiB of weights under a 12 GiB budget:
    `hostler preview --engine mlx --kv f16` admits it at a 79,872-token window (9.8 GiB).
    Today the planner (hostler.engines.price.price_engine -> the llama.cpp KV trade) offers
    MLX q8_0, sizes the window with q8_0's half price (131,072 tokens), then prices that
    window with MlxAdapter.estimate_footprint, which is f16 (15.3 GiB): the launch is
    REFUSED under every budget where the native window does not fit, though a smaller window
    at f16 would. `hostler preview` also shows "KV q8_0" and a q8_0 per-token price for an
    engine that cannot quantize its cache.
    """
    folder = mlx_folder(tmp_path, "qwen-like", json.dumps(QWEN_LIKE))
    os.truncate(folder / "model.safetensors", 300 * 2**20)
    plan = preview_json(tmp_path, folder, budget_gb=12)
    assert plan["kv_type"] == "f16", plan
    assert plan["admitted"] is True, plan["denial"]
    assert isinstance(plan["reserved_bytes"], int) and plan["reserved_bytes"] <= 12 * GIB


def test_an_mlx_model_of_unknown_geometry_is_planned_serial(tmp_path: Path) -> None:
    """M6: unknown geometry -> one slot; the plan, the price and the argv agree on serial.

    Today MlxAdapter.build_command launches `--decode-concurrency 1`, and estimate_mlx prices
    one slot, but the planner still plans several (3 under a 32 GiB budget: `hostler preview`
    shows "--parallel 3", and the runtime counts 3 slots for an engine that serves one
    request at a time).
    """
    folder = mlx_folder(tmp_path, "unknown", json.dumps({"model_type": "llama"}))
    os.truncate(folder / "model.safetensors", 300 * 2**20)
    plan = preview_json(tmp_path, folder, budget_gb=32)
    assert plan["slots"] == 1, plan


DEEP_BODY = b'{"a":' + b"[" * 30000 + b"]" * 30000 + b"}"  # 60 KiB: inside the 64 KiB read


def test_the_mlx_readiness_judges_a_deeply_nested_body_not_ready() -> None:
    """MlxAdapter.is_ready_response(200, <60 KiB of nested arrays>) is False, not an error.

    Today it raises RecursionError (hostler_mlx.adapter.MlxAdapter.is_ready_response catches
    ValueError/UnicodeDecodeError only); under the supervisor that turns an engine's odd
    answer into "the 'mlx' engine plugin raised RecursionError" and fails the engine.
    """
    assert MlxAdapter().is_ready_response(200, DEEP_BODY) is False
