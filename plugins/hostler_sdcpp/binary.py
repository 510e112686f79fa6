"""Finding the ``sd-server`` binary (stable-diffusion.cpp's HTTP server)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hostler.plugin import EngineBinaryError

__all__ = ["BINARY_ENV", "find_sd_server"]

#: The environment variable that names the binary.
BINARY_ENV = "HOSTLER_SD_SERVER"


def find_sd_server(configured: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run: ``configured``, then ``$HOSTLER_SD_SERVER``, then ``PATH``.

    Raises:
        EngineBinaryError: None found, or the one named is not an executable file.
    """
    named = configured or os.environ.get(BINARY_ENV)
    if named:
        try:
            path = Path(named).expanduser()
        except RuntimeError:  # ~user of a user this system does not know
            raise EngineBinaryError(
                f"{os.fspath(named)[:200]}: sd-server binary not found (no such home directory)"
            ) from None
        if not path.is_file():
            raise EngineBinaryError(f"{path}: sd-server binary not found")
        if not os.access(path, os.X_OK):
            raise EngineBinaryError(f"{path}: sd-server binary is not executable")
        return path
    on_path = shutil.which("sd-server")
    if on_path:
        return Path(on_path)
    raise EngineBinaryError(
        f"sd-server not found: set {BINARY_ENV}, put it on PATH, or name it as "
        "[engine_defaults.sdcpp] binary (build it from stable-diffusion.cpp's examples/server)"
    )
