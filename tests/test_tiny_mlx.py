"""hostler.testing.tiny_mlx: a tiny MLX model directory that the real mlx_lm loads offline."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hostler.testing.tiny_mlx import WORDS, TinyMlxModel, main, write_tiny_mlx


def _header(path: Path) -> dict[str, dict[str, object]]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header: dict[str, dict[str, object]] = json.loads(raw[8 : 8 + length])
    return header


def test_writes_a_directory_of_four_files(tmp_path: Path) -> None:
    out = write_tiny_mlx(tmp_path / "m", TinyMlxModel(layers=3))
    assert out.is_absolute()
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (3, 64, 16)
    assert config["vocab_size"] == 4 + len(WORDS)
    header = _header(out / "model.safetensors")
    meta = header.pop("__metadata__")
    assert meta == {"format": "mlx"}
    assert len(header) == 1 + 3 * 9 + 1  # embedding, 9 tensors a layer, final norm
    assert header["model.layers.2.self_attn.k_proj.weight"]["shape"] == [2 * 16, 64]
    end = max(int(t["data_offsets"][1]) for t in header.values())  # type: ignore[index]
    size = (out / "model.safetensors").stat().st_size
    (length,) = struct.unpack("<Q", (out / "model.safetensors").read_bytes()[:8])
    assert size == 8 + length + end


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    one = write_tiny_mlx(tmp_path / "a") / "model.safetensors"
    two = write_tiny_mlx(tmp_path / "b") / "model.safetensors"
    other = write_tiny_mlx(tmp_path / "c", TinyMlxModel(seed=1)) / "model.safetensors"
    assert one.read_bytes() == two.read_bytes() != other.read_bytes()


@pytest.mark.parametrize(
    "shape",
    [
        TinyMlxModel(layers=0),
        TinyMlxModel(hidden=-64),
        TinyMlxModel(hidden=66, heads=4),
        TinyMlxModel(heads=4, kv_heads=3),
    ],
)
def test_refuses_a_shape_llama_cannot_take(tmp_path: Path, shape: TinyMlxModel) -> None:
    with pytest.raises(ValueError, match="not a llama shape"):
        write_tiny_mlx(tmp_path / "m", shape)


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "m"), "--layers", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "n"), "--heads", "3"])
    assert exited.value.code == 2


@pytest.mark.slow
def test_the_real_mlx_lm_loads_it_offline_and_generates(tmp_path: Path) -> None:
    model = write_tiny_mlx(tmp_path / "m")
    script = (
        "import sys\n"
        "from mlx_lm import load, generate\n"
        "m, t = load(sys.argv[1])\n"
        "p = t.apply_chat_template([{'role': 'user', 'content': 'hello'}],"
        " add_generation_prompt=True)\n"
        "print(len(p), repr(generate(m, t, prompt=p, max_tokens=3)))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(model)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    count, text = done.stdout.split(" ", 1)
    assert int(count) == 5  # user : hello assistant : -> "user" <unk> "hello" "assistant" <unk>
    assert text.strip().startswith("'")
