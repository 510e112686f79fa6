"""Build ``sd-server`` from the ``stable-diffusion-cpp-python`` sdist (for ``tox -e sdcpp-real``).

Usage: ``python bench/build_sd_server.py DEST`` leaves the binary at ``DEST/bin/sd-server``
(kept between runs: an existing one is reused). Needs ``pip`` (to fetch the sdist from
PyPI), ``cmake`` and a C++ compiler; the CPU build takes minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

#: The sdist whose vendored stable-diffusion.cpp is built (its examples/server is sd-server).
SDIST = "stable-diffusion-cpp-python==0.4.7"


def run(*argv: str) -> None:
    """Run one step, echoed; a failure ends the build with its status."""
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def main(argv: list[str]) -> int:
    """Fetch, configure and build; print the binary's path."""
    if len(argv) != 1:
        print("usage: build_sd_server.py DEST", file=sys.stderr)
        return 2
    dest = Path(argv[0]).absolute()
    binary = dest / "bin" / "sd-server"
    if binary.is_file():
        print(binary)
        return 0
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            print(f"build_sd_server: {tool} not found; install it first", file=sys.stderr)
            return 1
    src = dest / "src"
    src.mkdir(parents=True, exist_ok=True)
    run(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        SDIST, "-d", str(src))  # fmt: skip
    archive = next(src.glob("stable_diffusion_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    root = next(p for p in src.iterdir() if p.is_dir()) / "vendor" / "stable-diffusion.cpp"
    build = dest / "build"
    run("cmake", "-S", str(root), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DSD_BUILD_EXAMPLES=ON", "-DSD_WEBP=OFF", "-DSD_WEBM=OFF")  # fmt: skip
    jobs = str(os.cpu_count() or 2)
    run("cmake", "--build", str(build), "--target", "sd-server", "-j", jobs)
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build / "bin" / "sd-server", binary)
    print(binary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
