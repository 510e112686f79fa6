"""Probing a llama-server on this CPU, and where a built one is kept (hostler_llamacpp.build)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from hostler_llamacpp.build import (
    CMAKE_OPTIONS,
    SOURCE_VERSION,
    VARIANT_OPTIONS,
    built_binary,
    cache_folder,
    engine_build,
    probe,
)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(f"#!{sys.executable}\n{body}\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_binary_that_says_it_listens_is_ready(tmp_path: Path) -> None:
    binary = _script(
        tmp_path,
        "import sys, time\nprint('loading', flush=True)\n"
        "print('main: server is listening on http://127.0.0.1:1', flush=True)\ntime.sleep(60)",
    )
    assert probe(binary, tmp_path / "model.gguf") is None


def test_a_binary_killed_by_sigill_before_ready_says_so_with_its_last_line(tmp_path: Path) -> None:
    binary = _script(
        tmp_path,
        "import os, signal\nprint('AMX is not ready to be used!', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGILL)",
    )
    assert probe(binary, tmp_path / "m.gguf") == (
        f"{binary} exited (signal 4) before it was ready: AMX is not ready to be used!"
    )


def test_a_binary_that_exits_says_its_code_and_one_that_never_listens_times_out(
    tmp_path: Path,
) -> None:
    binary = _script(tmp_path, "raise SystemExit(3)")
    assert probe(binary, tmp_path / "m.gguf") == f"{binary} exited (exit 3) before it was ready"
    silent = _script(tmp_path, "import time\ntime.sleep(60)")
    assert probe(silent, tmp_path / "m.gguf", timeout=0.5) == (
        f"{silent} exited (signal 9) before it was ready"
    )


def test_the_cache_is_per_version_and_options_and_holds_nothing_before_a_build(
    tmp_path: Path,
) -> None:
    folder = cache_folder({"XDG_CACHE_HOME": str(tmp_path)})
    assert folder.parent == tmp_path / "hostler"
    assert folder.name.startswith(f"llama.cpp-{SOURCE_VERSION}-")
    assert "-DGGML_NATIVE=OFF" in CMAKE_OPTIONS
    assert built_binary(folder) is None
    binary = folder / "build" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    assert built_binary(folder) is None  # no finished build: a half-done one is not used
    (folder / "built").write_text(f"{binary}\n", encoding="utf-8")
    assert built_binary(folder) == binary
    assert os.fspath(folder).startswith(os.fspath(tmp_path))


def test_a_cpu_variant_that_dies_here_is_set_aside_until_one_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L22: a CPU may report a feature its kernel does not let a program use (AMX in some VMs):
    the variant the loader picks then dies of SIGILL. Found on this machine: the built
    sapphirerapids variant died on a quantized model; without it, the next one ran."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = cache_folder(options=VARIANT_OPTIONS)
    bin_dir = folder / "build" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("sapphirerapids", "icelake", "haswell"):
        (bin_dir / f"libggml-cpu-{name}.so").write_bytes(b"")
    binary = _script(
        bin_dir,
        "import os, signal, sys, time\n"
        "here = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
        "if os.path.exists(os.path.join(here, 'libggml-cpu-sapphirerapids.so')):\n"
        "    os.kill(os.getpid(), signal.SIGILL)\n"
        "print('main: server is listening on http://127.0.0.1:1', flush=True)\ntime.sleep(60)",
    )
    (folder / "built").write_text(f"{binary}\n")
    said: list[str] = []
    assert engine_build(jobs=1, say=said.append, check_model=tmp_path / "m.gguf") == binary
    assert sorted(p.name for p in bin_dir.glob("libggml-cpu-*.so")) == [
        "libggml-cpu-haswell.so",
        "libggml-cpu-icelake.so",
    ]
    assert (bin_dir / "disabled" / "libggml-cpu-sapphirerapids.so").is_file()
    assert said[0].startswith("hostler: the sapphirerapids CPU variant dies here (")
    assert said[1] == f"hostler: {binary} runs on this CPU"


def test_a_build_no_variant_of_which_runs_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = cache_folder(options=VARIANT_OPTIONS)
    bin_dir = folder / "build" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "libggml-cpu-haswell.so").write_bytes(b"")
    binary = _script(bin_dir, "import os, signal\nos.kill(os.getpid(), signal.SIGILL)")
    (folder / "built").write_text(f"{binary}\n")
    with pytest.raises(RuntimeError, match=r"built, but it does not run here: .* \(signal 4\)"):
        engine_build(jobs=1, say=lambda _: None, check_model=tmp_path / "m.gguf")
