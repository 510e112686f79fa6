"""L14: llama-server's flags as one pure rule (config > tuning > planner; extras last win)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from hostler_llamacpp.flags import (
    DEFAULT_CACHE_REUSE,
    FLAGS_POLICY,
    FLAGS_POLICY_VERSION,
    FlagSet,
    Planned,
    effective_values,
    is_quantized,
    llama_flags,
    merge_flags,
)

BASE = [
    "--model",
    "/m.gguf",
    "--host",
    "127.0.0.1",
    "--port",
    "4321",
    "--jinja",
    "--ctx-size",
    "8192",
    "--parallel",
    "2",
]


def flags(
    *,
    kv_type: str | None = None,
    config: Mapping[str, object] | None = None,
    tuning: Mapping[str, object] | None = None,
    planned: Planned | None = None,
    extra: Mapping[str, str | int | float | bool] | None = None,
    slots: int = 2,
    save: str | None = None,
) -> FlagSet:
    return llama_flags(
        model="/m.gguf",
        port=4321,
        ctx_per_slot=4096,
        slots=slots,
        kv_type=kv_type,
        slot_save_path=save,
        config=config,
        tuning=tuning,
        planned=planned,
        extra_args=extra,
    )


def tail(result: FlagSet) -> list[str]:
    """The flags after the fixed head, without the default --cache-reuse."""
    argv = result.argv[len(BASE) :]
    at = argv.index("--cache-reuse")
    assert argv[at + 1] == "256"
    return argv[:at] + argv[at + 2 :]


def value(result: FlagSet, flag: str) -> str | None:
    return effective_values(result.argv)[flag]


def test_constants() -> None:
    assert DEFAULT_CACHE_REUSE == 256
    assert (FLAGS_POLICY, FLAGS_POLICY_VERSION) == ("llamacpp-flags", 1)


def test_the_launch_order_of_the_reference() -> None:
    result = flags(kv_type="q8_0", save="/slots", config={"mlock": True})
    assert result.argv == [
        *BASE,
        "--slot-save-path",
        "/slots",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "--mlock",
        "--flash-attn",
        "on",
        "--cache-reuse",
        "256",
    ]
    assert result.reasons == ["--flash-attn on: a q8_0 V cache needs flash attention"]


def test_bare_defaults() -> None:
    result = flags()
    assert result.argv == [*BASE, "--cache-reuse", "256"]
    assert result.reasons == []
    assert result.decision["policy"] == "llamacpp-flags"
    assert result.decision["version"] == 1
    assert result.decision["slots"] == 2
    assert result.decision["planned"] == Planned()


@pytest.mark.parametrize(
    ("slots", "ctx", "parallel"), [(0, "4096", "1"), (1, "4096", "1"), (3, "12288", "3")]
)
def test_total_context_is_per_slot_times_slots(slots: int, ctx: str, parallel: str) -> None:
    result = flags(slots=slots)
    assert (value(result, "--ctx-size"), value(result, "--parallel")) == (ctx, parallel)


def test_mlock_only_when_true() -> None:
    assert "--mlock" not in flags(config={"mlock": False}).argv
    assert "--mlock" not in flags(config={"mlock": "yes"}).argv


# ---- GPU layers and MoE offload


def test_the_planners_offload() -> None:
    assert tail(flags(planned=Planned(n_gpu_layers=-1))) == ["--n-gpu-layers", "all"]
    assert tail(flags(planned=Planned(n_gpu_layers="all", n_cpu_moe=5))) == [
        "--n-gpu-layers",
        "all",
        "--n-cpu-moe",
        "5",
    ]
    assert tail(flags(planned=Planned(n_gpu_layers=-1, cpu_moe=True, n_cpu_moe=5))) == [
        "--n-gpu-layers",
        "all",
        "--cpu-moe",
    ]
    assert tail(flags(planned=Planned(cpu_moe=True))) == ["--cpu-moe"]  # layers: the engine's
    assert tail(flags(planned=Planned(n_gpu_layers=0))) == ["--n-gpu-layers", "0"]
    assert tail(flags(planned=Planned(n_gpu_layers=-2))) == ["--n-gpu-layers", "-2"]


def test_config_beats_tuning_beats_planner_per_field() -> None:
    planned = Planned(n_gpu_layers=-1, n_cpu_moe=5)
    assert tail(flags(tuning={"n_gpu_layers": 20}, planned=planned)) == [
        "--n-gpu-layers",
        "20",
        "--n-cpu-moe",
        "5",
    ]
    both = flags(config={"n_gpu_layers": 30}, tuning={"n_gpu_layers": 20}, planned=planned)
    assert tail(both)[:2] == ["--n-gpu-layers", "30"]
    none_in_config = flags(config={"n_gpu_layers": None}, tuning={"n_gpu_layers": 20})
    assert tail(none_in_config) == ["--n-gpu-layers", "20"]  # None is unset, not a value
    assert tail(flags(config={"n_cpu_moe": 3}, planned=planned))[-2:] == ["--n-cpu-moe", "3"]


def test_cpu_moe_false_drops_the_planners_split_but_not_an_explicit_one() -> None:
    planned = Planned(n_gpu_layers=-1, cpu_moe=True, n_cpu_moe=5)
    assert tail(flags(config={"cpu_moe": False}, planned=planned)) == ["--n-gpu-layers", "all"]
    kept = flags(config={"cpu_moe": False}, tuning={"n_cpu_moe": 7}, planned=planned)
    assert tail(kept) == ["--n-gpu-layers", "all", "--n-cpu-moe", "7"]
    forced = flags(tuning={"cpu_moe": True}, planned=Planned(n_cpu_moe=5))
    assert tail(forced) == ["--cpu-moe"]


# ---- flash attention


@pytest.mark.parametrize(
    ("setting", "kv_type", "expected"),
    [
        (None, "q8_0", "on"),  # forced for a quantized V cache
        (None, "q4_0", "on"),
        (None, "f16", None),
        (None, None, None),
        (True, "f16", "on"),  # legacy true
        (False, "q8_0", None),  # legacy false: omitted
        ("auto", "f16", "auto"),
        (" AUTO ", "q8_0", "auto"),
        ("on", "f16", "on"),
        ("off", "f16", "off"),
    ],
)
def test_flash_attention(setting: object, kv_type: str | None, expected: str | None) -> None:
    result = flags(kv_type=kv_type, config={} if setting is None else {"flash_attn": setting})
    values = effective_values(result.argv)
    assert values.get("--flash-attn", "absent") == ("absent" if expected is None else expected)


def test_an_explicit_off_wins_over_a_quantized_cache_and_is_said() -> None:
    result = flags(kv_type="q8_0", tuning={"flash_attn": "off"})
    assert value(result, "--flash-attn") == "off"
    assert result.reasons == ["--flash-attn off as configured: llama.cpp refuses a q8_0 V cache"]
    assert flags(kv_type="f16", config={"flash_attn": "off"}).reasons == []


@pytest.mark.parametrize(
    ("kv_type", "quantized"),
    [
        (None, False),
        ("f16", False),
        ("BF16", False),
        ("f32", False),
        ("q8_0", True),
        ("q5_1", True),
    ],
)
def test_quantized(kv_type: str | None, quantized: bool) -> None:
    assert is_quantized(kv_type) is quantized


# ---- cache reuse, swa-full


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(None, "256"), (True, "256"), (1, "1"), (" 64 ", "64"), ("512", "512")],
)
def test_cache_reuse(setting: object, expected: str) -> None:
    assert value(flags(config={"cache_reuse": setting}), "--cache-reuse") == expected


@pytest.mark.parametrize("setting", [0, "0", " 0 ", False])
def test_cache_reuse_zero_omits_it(setting: object) -> None:
    assert "--cache-reuse" not in flags(tuning={"cache_reuse": setting}).argv


def test_swa_full() -> None:
    assert "--swa-full" not in flags().argv
    assert tail(flags(planned=Planned(swa_full=True))) == ["--swa-full"]
    assert "--swa-full" not in flags(planned=Planned(swa_full=False)).argv
    assert (
        "--swa-full" not in flags(config={"swa_full": False}, planned=Planned(swa_full=True)).argv
    )
    assert tail(flags(tuning={"swa_full": True}, planned=Planned(swa_full=False))) == ["--swa-full"]
    assert "--swa-full" not in flags(config={"swa_full": "yes"}).argv


# ---- valued settings, speculative decoding, reasoning, vision


def test_the_rest_in_order() -> None:
    config = {
        "threads": 8,
        "batch_size": 2048,
        "ubatch_size": 512,
        "chat_template": "chatml",
        "spec_type": "ngram",
        "spec_draft_model": "/d.gguf",
        "spec_draft_n_max": 16,
        "reasoning_format": "deepseek",
        "reasoning_preserve": True,
        "mmproj": "/p.gguf",
        "vision": True,
        "reasoning_budget": 0,
    }
    result = flags(config=config)
    assert result.argv[len(BASE) :] == [
        "--cache-reuse",
        "256",
        "--threads",
        "8",
        "--batch-size",
        "2048",
        "--ubatch-size",
        "512",
        "--chat-template",
        "chatml",
        "--spec-type",
        "ngram",
        "--spec-draft-model",
        "/d.gguf",
        "--spec-draft-n-max",
        "16",
        "--reasoning-format",
        "deepseek",
        "--reasoning-preserve",
        "--mmproj",
        "/p.gguf",
        "--reasoning-budget",
        "0",
    ]


def test_spec_type_none_is_omitted() -> None:
    assert "--spec-type" not in flags(config={"spec_type": "none"}).argv


def test_draft_mtp_needs_confirmed_layers() -> None:
    dropped = flags(config={"spec_type": "draft-mtp"})
    assert "--spec-type" not in dropped.argv
    assert dropped.reasons == [
        "--spec-type draft-mtp dropped: the model has no confirmed MTP layers"
    ]
    kept = flags(config={"spec_type": "draft-mtp"}, planned=Planned(mtp_confirmed=True))
    assert value(kept, "--spec-type") == "draft-mtp"
    assert kept.reasons == []


def test_reasoning_preserve_and_vision_only_when_true() -> None:
    assert "--reasoning-preserve" not in flags(config={"reasoning_preserve": False}).argv
    assert "--mmproj" not in flags(config={"mmproj": "/p.gguf"}).argv  # no opt-in
    assert "--mmproj" not in flags(config={"mmproj": "/p.gguf", "vision": "yes"}).argv
    assert "--mmproj" not in flags(config={"vision": True}).argv


# ---- extras: last, and the last occurrence wins


def test_extras_come_last_and_override() -> None:
    result = flags(
        kv_type="q8_0",
        planned=Planned(n_gpu_layers=-1),
        extra={"n-gpu-layers": 12, "--flash-attn": "off", "verbose": True, "cache-reuse": False},
    )
    assert result.argv[-5:] == ["--n-gpu-layers", "12", "--flash-attn", "off", "--verbose"]
    assert result.argv.count("--n-gpu-layers") == 1
    assert "--cache-reuse" not in result.argv
    assert result.decision["extra_args"] == {
        "n-gpu-layers": 12,
        "--flash-attn": "off",
        "verbose": True,
        "cache-reuse": False,
    }


@pytest.mark.parametrize("setting", [0, "0", " 0"])
def test_extra_cache_reuse_zero_is_off_but_other_zeros_are_values(setting: object) -> None:
    result = flags(extra={"cache-reuse": setting, "threads": 0})  # type: ignore[dict-item]
    assert "--cache-reuse" not in result.argv
    assert result.argv[-2:] == ["--threads", "0"]


def test_extra_false_removes_a_base_flag() -> None:
    assert "--jinja" not in flags(extra={"jinja": False}).argv


def test_merge_flags_keeps_the_last_occurrence_at_its_place() -> None:
    assert merge_flags([("--a", "1"), ("--b", None), ("--a", "2")], {"c": 3, "--b": "x"}) == [
        "--a",
        "2",
        "--c",
        "3",
        "--b",
        "x",
    ]
    assert merge_flags([("--a", "1")], {"a": True}) == ["--a"]
    assert merge_flags([], {}) == []


def test_effective_values_reads_the_last_occurrence() -> None:
    argv = ["bin", "--a", "1", "--flag", "--a", "2", "--seed", "-1", "--x", "-0.5", "--end"]
    assert effective_values(argv) == {
        "--a": "2",
        "--flag": None,
        "--seed": "-1",
        "--x": "-0.5",
        "--end": None,
    }
    assert effective_values([]) == {}
    assert effective_values(["--a", "--b"]) == {"--a": None, "--b": None}
    assert effective_values(["-v", "3"]) == {"-v": "3"}
    assert effective_values(["stray", "--a", "1"]) == {"--a": "1"}  # a leading value is skipped


def test_embeddings_come_after_the_engine_flags_and_before_the_extras() -> None:
    """L21: ``--embeddings`` and a ``--pooling`` for a model without its own; extras win."""
    flags = llama_flags(
        model="/m.gguf", port=1, ctx_per_slot=512, slots=1, embeddings=True, pooling="mean"
    )
    assert flags.argv[-3:] == ["--embeddings", "--pooling", "mean"]
    assert flags.decision["embeddings"] is True and flags.decision["pooling"] == "mean"
    bare = llama_flags(model="/m.gguf", port=1, ctx_per_slot=512, slots=1, embeddings=True)
    assert bare.argv[-1] == "--embeddings"
    off = llama_flags(
        model="/m.gguf",
        port=1,
        ctx_per_slot=512,
        slots=1,
        embeddings=True,
        pooling="mean",
        extra_args={"embeddings": False, "pooling": "last"},
    )
    assert "--embeddings" not in off.argv and off.argv[-2:] == ["--pooling", "last"]
