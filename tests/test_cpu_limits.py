"""L22: what engine builds cannot run on this CPU, folded, and where a built engine is found."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hostler.capacity.cpu_limits import CpuLimits, CpuUnsupported, weights_unrunnable
from hostler.probes.cpu import cpu_identity
from hostler_llamacpp.binary import find_llama_server
from hostler_llamacpp.build import VARIANT_OPTIONS, cache_folder, installed_build


def learned(
    what: str, build: str = "b1", cpu: str = "x86_64/abc", model: str = "m"
) -> CpuUnsupported:
    return CpuUnsupported(
        at=1.0, key="llamacpp:m:0", build=build, cpu=cpu, what=what, kv_type="q8_0",
        model=model, message="llamacpp:m:0: exited (signal 4) before becoming ready",
    )  # fmt: skip


def test_a_quantized_kv_failure_narrows_that_build_and_cpu_to_full_precision() -> None:
    limits = CpuLimits()
    assert limits.kv_types("b1", "x86_64/abc", None) is None  # nothing learned: any
    limits.apply(learned("quantized-kv"))
    assert limits.kv_types("b1", "x86_64/abc", None) == ("f16", "f32", "bf16")
    assert limits.kv_types("b1", "x86_64/abc", ("q8_0", "f16")) == ("f16",)
    assert limits.kv_types("b2", "x86_64/abc", None) is None  # another build: nothing known
    assert limits.kv_types("b1", "x86_64/def", ("q8_0",)) == ("q8_0",)  # another CPU
    assert limits.kv_types("b1", "x86_64/abc", ("q8_0", "q4_0")) == ("q8_0", "q4_0")


def test_a_weights_failure_is_kept_per_build_cpu_and_model() -> None:
    limits = CpuLimits()
    limits.apply(learned("weights", model="alpha"))
    found = limits.unrunnable("b1", "x86_64/abc", "alpha")
    assert found is not None and found.what == "weights"
    assert limits.unrunnable("b1", "x86_64/abc", "beta") is None
    assert limits.unrunnable("b2", "x86_64/abc", "alpha") is None


def test_the_weights_line_names_the_fix() -> None:
    line = weights_unrunnable(
        "llamacpp:m:0", "llamacpp:m:0: exited (signal 4) before becoming ready"
    )
    assert line == (
        "llamacpp:m:0: this engine build cannot run the model's weights on this CPU: it died of "
        "SIGILL (an instruction this CPU lacks) even with an f16 KV cache (exited (signal 4) "
        "before becoming ready); build an engine for this CPU with `hostler engine build "
        "llamacpp`, or use a model of another type (F16, Q4_K)"
    )


def test_the_cpu_is_named_by_its_machine_and_features() -> None:
    machine, _, digest = cpu_identity().partition("/")
    assert machine and len(digest) == 12 and int(digest, 16) >= 0
    assert cpu_identity() == cpu_identity()


def test_a_built_engine_is_found_after_path_and_before_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("HOSTLER_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    wheel = find_llama_server()
    assert installed_build() is None
    folder = cache_folder(options=VARIANT_OPTIONS)
    binary = folder / "build" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert find_llama_server() == wheel  # not finished: not used
    (folder / "built").write_text(f"{binary}\n")
    assert installed_build() == binary
    assert find_llama_server() == binary
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "llama-server").write_text("#!/bin/sh\n")
    (on_path / "llama-server").chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    assert find_llama_server() == on_path / "llama-server"


def test_engine_build_of_an_engine_with_no_builder_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hostler", "engine", "build", "mlx"],
        check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "hostler: error [usage.invalid]: engine build: 'mlx' cannot be built here (buildable: "
        "llamacpp); install that engine's own binary\n"
    )
