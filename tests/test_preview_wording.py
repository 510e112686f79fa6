"""``hostler preview`` words a plan in no engine's flags: window per slot, slots, KV type.

It used to say ``(--ctx-size N --parallel N)`` for every engine, MLX included; an MLX launch
has no such flags. Real CLI, real tiny models (a GGUF and an MLX folder), this host's budget.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hostler.cli import main
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler.testing.tiny_mlx import write_tiny_mlx
from hostler_llamacpp.flags import llama_flags


def llama_spellings() -> set[str]:
    """Every flag llama-server is launched with for a plan with a KV type, and their short forms."""
    argv = llama_flags(model="/m.gguf", port=1, ctx_per_slot=512, slots=2, kv_type="q8_0").argv
    flags = {arg for arg in argv if arg.startswith("-")}
    assert {"--ctx-size", "--parallel", "--cache-type-k", "--cache-type-v"} <= flags
    return flags | {"-c", "-np", "-ctk", "-ctv"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {
        "mlx": write_tiny_mlx(folder / "Tiny-MLX-4bit"),
        "llamacpp": write_tiny_llama(folder / "tiny.gguf"),
    }


def preview(
    engine: str, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> str:
    ledger = str(tmp_path / "ledger.db")
    args = ["preview", str(model), "--engine", engine, "--ledger", ledger, "--standalone"]
    status = main([*args, "--ctx", "1024", "--slots", "2", *extra])
    out, err = capsys.readouterr()
    assert status == 0, err
    return out


@pytest.mark.parametrize("engine", ["mlx", "llamacpp"])
def test_the_plan_line_names_window_slots_and_kv_in_no_engines_flags(
    engine: str, models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = preview(engine, models[engine], tmp_path, capsys, "--kv", "f16")
    plan = next(line for line in out.splitlines() if line.startswith("plan "))
    assert plan == "plan     fits: 1024 tokens per slot × 2 slot(s) (2048 tokens in all), KV f16"
    words = set(re.findall(r"(?<!\S)-{1,2}[a-z][a-z-]*", out))
    assert not words & llama_spellings(), f"{engine} preview speaks llama.cpp: {words}"


def test_the_json_plan_has_the_same_figures(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = preview("mlx", models["mlx"], tmp_path, capsys, "--kv", "f16", "--json")
    plan = json.loads(out)
    assert (plan["context_window"], plan["slots"], plan["total_ctx"], plan["kv_type"]) == (
        1024,
        2,
        2048,
        "f16",
    )


def test_the_slots_option_is_not_explained_by_a_llama_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["preview", "--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert "--parallel" not in help_text
    assert "concurrent slots (requests served at once)" in " ".join(help_text.split())


def _configured(models: dict[str, Path], tmp_path: Path) -> Path:
    config = tmp_path / "hostler.toml"
    config.write_text(
        f'[daemon]\nledger = "{tmp_path / "ledger.db"}"\n'
        f'\n[[engines]]\nkey = "llamacpp:tiny:0"\nmodel = "{models["llamacpp"]}"\n'
        'ctx = 768\nslots = 3\nkv_type = "f16"\n'
    )
    return config


@pytest.mark.parametrize("name", ["llamacpp:tiny:0", "tiny", "path"])
def test_preview_with_a_config_prices_its_engine_as_configured(
    name: str, models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _configured(models, tmp_path)
    given = str(models["llamacpp"]) if name == "path" else name
    assert main(["preview", given, "--config", str(config), "--json", "--standalone"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["context_window"], plan["slots"], plan["kv_type"]) == (768, 3, "f16")


def test_preview_flags_win_over_the_configured_engine(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _configured(models, tmp_path)
    args = ["preview", "tiny", "--config", str(config), "--json", "--slots", "1", "--ctx", "640"]
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["context_window"], plan["slots"], plan["kv_type"]) == (640, 1, "f16")


def test_preview_of_a_name_no_config_engine_has_says_which_it_has(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _configured(models, tmp_path)
    assert main(["preview", "nope", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "hostler: error [usage.invalid]: nope: no such model file, and no engine of the config "
        "is called that "
        "(its engines: llamacpp:tiny:0); give a path, an engine key or a model id"
    ]
    assert main(["preview", "tiny", "--config", str(config), "--engine", "mlx"]) == 2
    assert "--engine mlx: llamacpp:tiny:0 is a llamacpp engine" in capsys.readouterr().err
