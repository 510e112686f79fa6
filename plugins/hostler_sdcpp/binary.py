"""Finding the ``sd-server`` binary (stable-diffusion.cpp's HTTP server)."""

from __future__ import annotations

import os
from pathlib import Path

from hostler.plugin import find_engine_binary

__all__ = ["BINARY_ENV", "find_sd_server"]

#: The environment variable that names the binary.
BINARY_ENV = "HOSTLER_SD_SERVER"


def find_sd_server(configured: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run: ``configured``, then ``$HOSTLER_SD_SERVER``, then ``PATH``.

    The search is :func:`hostler.plugin.find_engine_binary`.

    Raises:
        EngineBinaryError: None found, or the one named is not an executable file.
    """
    return find_engine_binary(
        configured,
        BINARY_ENV,
        "sd-server",
        hint="name it as [engine_defaults.sdcpp] binary (build it from stable-diffusion.cpp's "
        "examples/server)",
    )
