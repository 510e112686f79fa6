"""The llama.cpp adapter's facts: argv (§3.1, L14), panic lines (SV14), build metadata (L18)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostler.plugin import LaunchSpec
from hostler_llamacpp.adapter import LlamaCppAdapter, build_metadata, merge_flags
from hostler_llamacpp.logs import parse_buffer_sizes, parse_build
from hostler_llamacpp.panic import classify_line


def spec(**kw: object) -> LaunchSpec:
    base: dict[str, object] = {
        "key": "llamacpp:m:0",
        "model": Path("/m.gguf"),
        "port": 4321,
        "ctx_per_slot": 4096,
        "slots": 3,
    }
    base.update(kw)
    return LaunchSpec(**base)  # type: ignore[arg-type]


def test_argv_follows_the_plan() -> None:
    argv = LlamaCppAdapter().build_command(spec(kv_type="q8_0", work_dir=Path("/w"))).argv
    assert argv[0].endswith("llama-server")
    joined = " ".join(argv[1:])
    assert joined.startswith(
        "--model /m.gguf --host 127.0.0.1 --port 4321 --jinja --ctx-size 12288 --parallel 3"
    )
    assert "--slot-save-path /w" in joined
    assert "--cache-type-k q8_0 --cache-type-v q8_0 --flash-attn on" in joined
    # L21: every engine also serves /v1/embeddings; a model declaring no pooling gets mean
    assert joined.endswith("--cache-reuse 256 --embeddings --pooling mean")


def header_only_gguf(path: Path, architecture: str, pooling: int | None) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_embedding_model_keeps_its_own_pooling(tmp_path: Path) -> None:
    """L21: ``--pooling mean`` only for a model that declares none (a chat model)."""
    bert = header_only_gguf(tmp_path / "bge.gguf", "bert", pooling=2)  # CLS
    chat = header_only_gguf(tmp_path / "chat.gguf", "llama", pooling=None)
    argv = LlamaCppAdapter().build_command(spec(model=bert)).argv
    assert argv[-1] == "--embeddings" and "--pooling" not in argv
    argv = LlamaCppAdapter().build_command(spec(model=chat)).argv
    assert argv[-3:] == ["--embeddings", "--pooling", "mean"]


def test_embeddings_can_be_turned_off_or_overridden() -> None:
    off = LlamaCppAdapter().build_command(spec(options={"embeddings": False})).argv
    assert "--embeddings" not in off and "--pooling" not in off
    cls = LlamaCppAdapter().build_command(spec(extra_args={"pooling": "cls"})).argv
    assert cls[-3:] == ["--embeddings", "--pooling", "cls"]


def test_full_precision_kv_does_not_force_flash_attention() -> None:
    argv = LlamaCppAdapter().build_command(spec(kv_type="f16")).argv
    assert "--flash-attn" not in argv


def test_extra_args_come_last_and_win() -> None:
    argv = (
        LlamaCppAdapter()
        .build_command(
            spec(
                kv_type="q8_0",
                extra_args={
                    "flash-attn": "off",
                    "--threads": 4,
                    "mlock": True,
                    "cache-reuse": False,
                },
            )
        )
        .argv
    )
    assert argv.count("--flash-attn") == 1
    assert argv[argv.index("--flash-attn") + 1] == "off"
    assert argv[-3:] == ["--threads", "4", "--mlock"]
    assert "--cache-reuse" not in argv


def test_merge_flags_last_occurrence_wins() -> None:
    assert merge_flags([("--a", "1"), ("--b", None), ("--a", "2")], {"c": "3"}) == [
        "--b",
        "--a",
        "2",
        "--c",
        "3",
    ]


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("CUDA error: invalid configuration argument", "cuda-invalid-argument"),
        ("ggml_cuda_host_malloc: failed: CUDA error: out of memory", "cuda-out-of-memory"),
        ("ggml_vulkan: Device memory allocation of size 123 failed", "vulkan-out-of-memory"),
        ("CUDA error: an illegal memory access was encountered", "cuda-illegal-memory-access"),
        ("CUDA error: device-side assert triggered", "cuda-device-assert"),
        ("CUDA error: unknown error", "cuda-error"),
        ("GGML_ASSERT(n_tokens > 0) failed", "assertion"),
        (
            "E gguf_init_from_file: failed to open GGUF file '/tmp/nope.gguf' (No such file or directory)",
            "model-unreadable",
        ),
        ("E gguf_init_from_reader: bad GGUF version: 0", "model-unreadable"),
        (
            "E srv  start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
            "bind-failed",
        ),
        ("error: invalid argument: --bogus-flag", "bad-argument"),
    ],
)
def test_panic_classifier(line: str, kind: str) -> None:
    panic = classify_line(line)
    assert panic is not None
    assert panic.kind == kind


def test_ordinary_lines_are_not_panics() -> None:
    assert classify_line("srv  llama_server: model loaded") is None


def test_build_metadata_sidecar(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("")
    assert build_metadata(binary) is None
    (tmp_path / "hostler-llama-build.json").write_text(
        json.dumps(
            {"schemaVersion": 1, "engine": "llama-cpp", "revision": "b6000", "backend": "cuda"}
        )
    )
    assert build_metadata(binary) == {
        "schemaVersion": 1,
        "engine": "llama-cpp",
        "revision": "b6000",
        "backend": "cuda",
    }
    (tmp_path / "hostler-llama-build.json").write_text(json.dumps({"schemaVersion": 2}))
    assert build_metadata(binary) is None
    (tmp_path / "hostler-llama-build.json").write_text("{not json")
    assert build_metadata(binary) is None


def test_buffer_lines_count_once_per_start() -> None:
    log = (
        "load_tensors:   CPU_Mapped model buffer size =    92.10 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =    45.00 MiB\n"
        "sched_reserve:        CPU compute buffer size =    14.51 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =    45.00 MiB\n"  # printed again at exit
    )
    sizes = parse_buffer_sizes(log)
    assert sizes.kv == (45 * 1024**2)
    assert sizes.total == round(92.10 * 1024**2) + (45 * 1024**2) + round(14.51 * 1024**2)
    assert parse_build("build 1 (7e4c0a9) with GNU 11.4.0") == "b1-7e4c0a9"
    assert parse_build('{"build_info":"b1-7e4c0a9"}') == "b1-7e4c0a9"
    assert parse_build("nothing here") is None


def test_startup_phases() -> None:
    from hostler_llamacpp.logs import classify_phase

    assert classify_phase("srv    load_model: loading model '/m.gguf'") == "loading_model"
    assert classify_phase("main: server is listening on http://127.0.0.1:8080") == "ready"
    assert classify_phase("srv  llama_server: listening on http://127.0.0.1:18080") == "ready"
    assert (
        classify_phase("slot update_slots: id  0 | task 0 | prompt processing progress")
        == "prefill"
    )
    assert classify_phase("nothing to see") is None


def test_a_binary_under_an_unknown_users_home_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HOSTLER_LLAMA_SERVER=~nouser/...`` was a RuntimeError from expanduser()."""
    from hostler.plugin import EngineBinaryError
    from hostler_llamacpp.binary import find_llama_server

    monkeypatch.setenv("HOSTLER_LLAMA_SERVER", "~no-such-user-hostler/bin/llama-server")
    with pytest.raises(EngineBinaryError) as caught:
        find_llama_server()
    assert str(caught.value) == (
        "~no-such-user-hostler/bin/llama-server: llama-server binary not found "
        "(no such home directory; named by $HOSTLER_LLAMA_SERVER)"
    )
