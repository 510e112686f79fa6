"""The sd-cpp adapter's facts: argv (I2), readiness (I1), output (I5, SV14), price (I6)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hostler.errors import EngineBinaryError, ModelFileError, UsageError
from hostler.plugin import EngineAdapter, LaunchSpec, launch_command
from hostler_sdcpp import SdCppAdapter
from hostler_sdcpp.binary import BINARY_ENV, find_sd_server
from hostler_sdcpp.logs import classify_line, progress
from hostler_sdcpp.pricing import ImagePlan, image_footprint

from _fake_sdserver import shim

MIB = 1024**2


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    return shim(tmp_path / "bin")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "sd.safetensors"
    path.write_bytes(b"\0" * 1000)
    return path


def spec(model: Path, binary: Path, **options: object) -> LaunchSpec:
    return LaunchSpec("sdcpp:sd:0", model, 18090, ctx_per_slot=512, options=options, binary=binary)


def test_the_class_facts() -> None:
    assert SdCppAdapter.engine_type == "sdcpp"
    assert SdCppAdapter.readiness_path == "/"
    assert SdCppAdapter.gpu_slot == "image"
    assert SdCppAdapter.applies_extra_args is True
    assert set(SdCppAdapter.options_schema) == {
        "diffusion_model", "steps", "vae_tiling", "width", "height", "batch",
        "vae", "taesd", "clip_l", "clip_g", "clip_vision", "t5xxl", "llm", "control_net",
    }  # fmt: skip


def test_a_plain_model_argv(model: Path, binary: Path) -> None:
    argv = SdCppAdapter().build_command(spec(model, binary)).argv
    assert argv == [
        str(binary), "--model", str(model), "--vae-tiling",
        "--listen-ip", "127.0.0.1", "--listen-port", "18090",
    ]  # fmt: skip
    assert "--host" not in argv and "--port" not in argv  # IN41


def test_a_diffusion_model_with_roles_steps_and_no_tiling(
    model: Path, binary: Path, tmp_path: Path
) -> None:
    options: dict[str, object] = {
        "diffusion_model": True,
        "llm": "qwen.gguf",  # relative: made absolute
        "vae": str(tmp_path / "ae.sft"),
        "control_net": str(tmp_path / "cn.gguf"),
        "steps": 4,
        "vae_tiling": False,
    }
    command = SdCppAdapter().build_command(spec(model, binary, **options))
    extras = {"--offload-to-cpu": True, "--diffusion-fa": False, "--threads": 4}
    launched = launch_command(
        SdCppAdapter(), replace(spec(model, binary, **options), extra_args=extras)
    )
    assert command.argv == [
        str(binary), "--diffusion-model", str(model),
        "--vae", str(tmp_path / "ae.sft"),
        "--llm", str(Path("qwen.gguf").absolute()),
        "--control-net", str(tmp_path / "cn.gguf"),
        "--steps", "4",
        "--listen-ip", "127.0.0.1", "--listen-port", "18090",
    ]  # fmt: skip
    assert launched.argv == [*command.argv, "--offload-to-cpu", "--threads", "4"]


def test_the_binary_is_found_in_order(
    binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BINARY_ENV, str(binary))
    assert find_sd_server() == binary
    monkeypatch.delenv(BINARY_ENV)
    monkeypatch.setenv("PATH", str(binary.parent))
    assert find_sd_server() == binary
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(EngineBinaryError, match="sd-server not found: set HOSTLER_SD_SERVER"):
        find_sd_server()
    with pytest.raises(EngineBinaryError, match="binary not found"):
        find_sd_server(tmp_path / "missing")
    plain = tmp_path / "plain"
    plain.write_text("")
    plain.chmod(0o644)
    with pytest.raises(EngineBinaryError, match="not executable"):
        find_sd_server(plain)


def test_readiness_is_any_answer_at_the_root(model: Path, binary: Path) -> None:
    adapter = SdCppAdapter()
    probe = adapter.readiness(spec(model, binary))
    assert (probe.path, probe.method, probe.ready_line, probe.wait) == ("/", "GET", None, 2.0)
    for status in (100, 200, 404, 500, 503, 599):
        assert adapter.is_ready_response(status, b"") is True
    for status in (0, 99, 600, -1):
        assert adapter.is_ready_response(status, b"") is False
    # the periodic health check stays 2xx only (sd-server's index answers 200)
    assert adapter.is_ready(200) and not adapter.is_ready(404)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096 MiB: out of memory", "gpu-out-of-memory"),
        ("[ERROR] main.cpp:92 - new_sd_ctx_t failed", "model-unreadable"),
        ("[ERROR] stable-diffusion.cpp:214  - init model loader from file failed: 'x'", "model-unreadable"),
        ("[ERROR] common.cpp:290 - error: unknown argument: --host", "bad-arguments"),
        ("[ERROR] common.cpp:286 - error: invalid parameter for argument: --steps", "bad-arguments"),
        ("[ERROR] common.cpp:615 - error: the following arguments are required: model_path", "bad-arguments"),
        ("GGML_ASSERT(ctx != nullptr) failed", "assertion"),
        ("[INFO ] loading model from 'sd.safetensors'", None),
        ("  |=====>   | 3/20 - 1.52s/it", None),
    ],
)  # fmt: skip
def test_fatal_lines(line: str, kind: str | None) -> None:
    panic = classify_line(line)
    assert (panic.kind if panic else None) == kind


def test_progress_lines() -> None:
    bar = "|" + "=" * 10 + ">" + " " * 39 + "|"
    assert progress(f"  {bar} 3/20 - 1.52s/it") == (3, 20)
    assert progress(f"\r  {bar} 1/4 - 2.10it/s\r  {bar} 2/4 - 2.00it/s") == (2, 4)
    assert progress(f"  {bar} 4/4 - 0.50s/it") == (4, 4)
    assert progress(f"  {bar} 5/4 - 0.50s/it") is None
    assert progress(f"  {bar} 0/0 - 0.50s/it") is None
    assert progress("loading model") is None


def test_the_price_counts_roles_and_the_plan(model: Path, binary: Path, tmp_path: Path) -> None:
    adapter = SdCppAdapter()
    geometry = adapter.read_geometry(model)
    assert (geometry.architecture, geometry.file_size) == ("stable-diffusion", 1000)
    base = adapter.estimate_footprint(geometry, spec(model, binary))
    assert base == image_footprint(1000, ImagePlan())
    vae = tmp_path / "vae.sft"
    vae.write_bytes(b"\0" * 500)
    wide = spec(model, binary, vae=str(vae), width=1024, height=768, batch=2)
    assert adapter.estimate_footprint(geometry, wide) == image_footprint(
        1500, ImagePlan(1024, 768, 2)
    )
    with pytest.raises(ModelFileError, match="no such model file"):
        adapter.estimate_footprint(geometry, spec(model, binary, vae=str(tmp_path / "gone")))
    with pytest.raises(UsageError, match="sdcpp options: width 100: a multiple of 8 pixels"):
        adapter.estimate_footprint(geometry, spec(model, binary, width=100))
    with pytest.raises(ModelFileError, match="no such model file"):
        adapter.read_geometry(tmp_path / "absent.safetensors")


def test_an_adapter_gpu_slot_is_checked_when_defined() -> None:
    with pytest.raises(ValueError, match="gpu_slot 'audio': use one of llm, image, video"):
        type("Bad", (EngineAdapter,), {"engine_type": "bad", "gpu_slot": "audio"})
