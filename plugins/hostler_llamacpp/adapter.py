"""The llama.cpp adapter: how ``llama-server`` is launched and read (facts, not policy)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from hostler.capacity.estimate import estimate_llama
from hostler.capacity.geometry import ModelGeometry
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, Panic
from hostler_llamacpp.binary import find_llama_server
from hostler_llamacpp.panic import classify_line

__all__ = ["LlamaCppAdapter", "build_metadata", "merge_flags"]

_FULL_PRECISION = {"f16", "bf16", "f32"}
BUILD_SIDECAR = "hostler-llama-build.json"
#: L14: ``--cache-reuse`` when the config says nothing (at any slot count).
DEFAULT_CACHE_REUSE = 256
_DISABLED = {"0", "False"}


def _is_cache_reuse(flag: str) -> bool:
    return flag.lstrip("-") == "cache-reuse"


def merge_flags(
    base: list[tuple[str, str | None]], extra: Mapping[str, str | int | float | bool]
) -> list[str]:
    """Flags in order, with operator extras last; a flag given again replaces the earlier one.

    ``True`` is a bare flag, ``False`` removes the flag, anything else is its value. Keys are
    normalised to ``--key``.
    """
    merged: dict[str, str | None] = {}
    value: str | int | float | bool | None
    for flag, value in base:
        merged.pop(flag, None)
        merged[flag] = value
    for raw, value in extra.items():
        flag = raw if raw.startswith("-") else f"--{raw}"
        merged.pop(flag, None)
        if value is False:
            continue
        merged[flag] = None if value is True else str(value)
    argv: list[str] = []
    for flag, value in merged.items():
        argv.append(flag)
        if value is not None:
            argv.append(value)
    return argv


def build_metadata(binary: Path) -> dict[str, object] | None:
    """L18: the JSON sidecar next to the binary (schemaVersion 1), or None if absent/invalid."""
    sidecar = binary.parent / BUILD_SIDECAR
    try:
        data = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schemaVersion") != 1:
        return None
    if data.get("engine") not in {"llama-cpp", "llamacpp"} or not data.get("revision"):
        return None
    return data


class LlamaCppAdapter(EngineAdapter):
    """``llama-server`` from llama.cpp."""

    engine_type = "llamacpp"
    readiness_path = "/health"

    def __init__(self, binary: str | os.PathLike[str] | None = None) -> None:
        self._configured = binary

    def binary(self) -> Path:
        """The binary this adapter launches (raises ``EngineBinaryError`` if none)."""
        return find_llama_server(self._configured)

    def build_command(self, spec: LaunchSpec) -> LaunchCommand:
        """§3.1: model, loopback host/port, total context, slots, cache types, then extras."""
        binary = self.binary()
        flags: list[tuple[str, str | None]] = [
            ("--model", str(spec.model)),
            ("--host", "127.0.0.1"),
            ("--port", str(spec.port)),
            ("--jinja", None),
            ("--ctx-size", str(spec.ctx_per_slot * spec.slots)),
            ("--parallel", str(spec.slots)),
        ]
        if spec.work_dir is not None:
            flags.append(("--slot-save-path", str(spec.work_dir)))
        if spec.kv_type:
            flags += [("--cache-type-k", spec.kv_type), ("--cache-type-v", spec.kv_type)]
            if spec.kv_type.lower() not in _FULL_PRECISION:
                flags.append(("--flash-attn", "on"))  # quantized V cache needs flash attention
        reuse = spec.options.get("cache_reuse", DEFAULT_CACHE_REUSE)
        if str(reuse).strip() not in _DISABLED:  # L14: 0 disables (the engine's own default)
            flags.append(("--cache-reuse", str(reuse)))
        extra = {
            flag: False if _is_cache_reuse(flag) and str(value).strip() in _DISABLED else value
            for flag, value in spec.extra_args.items()
        }
        argv = [str(binary), *merge_flags(flags, extra)]
        path = os.environ.get("PATH", "")
        return LaunchCommand(argv, {"PATH": f"{binary.parent}{os.pathsep}{path}"})

    def estimate_footprint(self, geometry: ModelGeometry, spec: LaunchSpec) -> int:
        """The llama-server footprint estimate at its peak (tensor data + KV cells + runtime)."""
        return estimate_llama(
            geometry,
            ctx_total=spec.ctx_per_slot * spec.slots,
            slots=spec.slots,
            kv_type=spec.kv_type or "f16",
        ).peak

    def classify_line(self, line: str) -> Panic | None:
        """SV14 and llama-server's startup failures."""
        return classify_line(line)

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
